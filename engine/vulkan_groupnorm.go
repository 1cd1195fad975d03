package engine

import (
	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

func init() {
	vulkanLowerings[cgo.OpGroupNorm] = gnLowerGroupNorm
	vulkanLowerings[cgo.OpChannelAffine] = gnLowerChannelAffine
	vulkanLowerings[cgo.OpSnakeBeta] = gnLowerSnakeBeta
}

func gnLowerGroupNorm(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("GroupNorm", 1, 3); err != nil {
		return nil, err
	}
	var w, b *vulkan.Tensor
	if len(n.Src) > 1 {
		w = &n.Src[1]
	}
	if len(n.Src) > 2 {
		b = &n.Src[2]
	}
	d, err := vulkan.GroupNormOp(n.Src[0], w, b, n.Dst, int(n.IP[0]), n.FP[0])
	return []vulkan.Dispatch{d}, err
}

func gnLowerChannelAffine(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("ChannelAffine", 2, 3); err != nil {
		return nil, err
	}
	var shift vulkan.Tensor // none: the CPU kernel's optional shift
	if len(n.Src) > 2 {
		shift = n.Src[2]
	}
	d, err := vulkan.ChannelAffineOp(n.Src[0], n.Src[1], shift, n.Dst)
	return []vulkan.Dispatch{d}, err
}

func gnLowerSnakeBeta(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("SnakeBeta", 3, 3); err != nil {
		return nil, err
	}
	d, err := vulkan.SnakeBetaOp(n.Src[0], n.Src[1], n.Src[2], n.Dst)
	return []vulkan.Dispatch{d}, err
}
