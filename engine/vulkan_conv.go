package engine

import (
	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

func init() {
	vulkanLowerings[cgo.OpConv1D] = convLowerConv1D
	vulkanLowerings[cgo.OpConv2D] = convLowerConv2D
	vulkanLowerings[cgo.OpConvTranspose1D] = convLowerConvTranspose1D
}

// convOperands checks a conv node: x, w and an optional bias, all F32 (the shaders read no
// other encoding; an F16 or packed F32P weight is refused by name), and returns the bias.
func convOperands(op cgo.Op, n vulkanNode) (*vulkan.Tensor, error) {
	if err := n.f32("op "+opName(op), 2, 3, "input", "weight", "bias"); err != nil {
		return nil, err
	}
	if len(n.Src) == 3 {
		return &n.Src[2], nil
	}
	return nil, nil
}

// convLowerConv1D: ip 0 stride, 1 pad_left, 2 pad_right, 3 dilation, 4 groups (vx.h).
func convLowerConv1D(n vulkanNode) ([]vulkan.Dispatch, error) {
	bias, err := convOperands(cgo.OpConv1D, n)
	if err != nil {
		return nil, err
	}
	ip := n.IP
	d, err := vulkan.Conv1DOp(n.Src[0], n.Src[1], bias, n.Dst, int(ip[0]), int(ip[1]), int(ip[2]), int(ip[3]), int(ip[4]))
	return []vulkan.Dispatch{d}, err
}

// convLowerConv2D: ip 0 stride_h, 1 stride_w, 2 pad_h, 3 pad_w, 4 dil_h, 5 dil_w, 6 groups.
func convLowerConv2D(n vulkanNode) ([]vulkan.Dispatch, error) {
	bias, err := convOperands(cgo.OpConv2D, n)
	if err != nil {
		return nil, err
	}
	ip := n.IP
	d, err := vulkan.Conv2DOp(n.Src[0], n.Src[1], bias, n.Dst, int(ip[0]), int(ip[1]), int(ip[2]), int(ip[3]), int(ip[4]), int(ip[5]), int(ip[6]))
	return []vulkan.Dispatch{d}, err
}

// convLowerConvTranspose1D: ip 0 stride, 1 padding, 2 output_padding, 3 dilation, 4 groups.
func convLowerConvTranspose1D(n vulkanNode) ([]vulkan.Dispatch, error) {
	bias, err := convOperands(cgo.OpConvTranspose1D, n)
	if err != nil {
		return nil, err
	}
	ip := n.IP
	d, err := vulkan.ConvTranspose1DOp(n.Src[0], n.Src[1], bias, n.Dst, int(ip[0]), int(ip[1]), int(ip[2]), int(ip[3]), int(ip[4]))
	return []vulkan.Dispatch{d}, err
}
