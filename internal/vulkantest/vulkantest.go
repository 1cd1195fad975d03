// Package vulkantest gives tests a Vulkan device or a reason: tests skip without one,
// unless VOXPIPE_REQUIRE_VULKAN is set (make test sets it; CI installs Mesa's lavapipe).
package vulkantest

import (
	"os"
	"testing"

	"github.com/voxpipe/voxpipe/vulkan"
)

// Require skips t (or fails it, under VOXPIPE_REQUIRE_VULKAN) when no Vulkan device works.
func Require(t testing.TB) {
	t.Helper()
	devs, err := vulkan.Devices()
	if err == nil && len(devs) == 0 {
		err = os.ErrNotExist
	}
	if err != nil {
		if os.Getenv("VOXPIPE_REQUIRE_VULKAN") != "" {
			t.Fatalf("Vulkan is required here (VOXPIPE_REQUIRE_VULKAN) but: %v", err)
		}
		t.Skipf("no Vulkan device: %v", err)
	}
}
