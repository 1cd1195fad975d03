package vulkan

// Test hooks into vk.c. Test files cannot use cgo, so these thin wrappers live here; the
// exported one lets the layers above (engine) test their handling of a driver's failures.

/*
#include "vk.h"
*/
import "C"

// VkResult values the tests inject.
const (
	vkTimeout         = 2
	vkErrorDeviceLost = -4
	vkErrorOutOfHost  = -1
)

// InjectSubmitResult makes the device's next submission return result (a VkResult: -4 is
// VK_ERROR_DEVICE_LOST) without running: a driver's failure that lavapipe never produces.
// For tests only.
func (d *Device) InjectSubmitResult(result int) { C.vxk_inject(d.d, C.int(result)) }
