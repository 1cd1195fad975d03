package vulkan

// Test hooks into vk.c. Test files cannot use cgo, so these thin unexported wrappers live here.

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

// injectSubmitResult makes the device's next submission return result (a VkResult) without
// running: a driver's failure that lavapipe never produces.
func (d *Device) injectSubmitResult(result int) { C.vxk_inject(d.d, C.int(result)) }
