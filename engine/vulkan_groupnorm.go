package engine

import (
	"fmt"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

func init() {
	vulkanLowerings[cgo.OpGroupNorm] = gnLowerGroupNorm
	vulkanLowerings[cgo.OpChannelAffine] = gnLowerChannelAffine
	vulkanLowerings[cgo.OpSnakeBeta] = gnLowerSnakeBeta
}

// gnF32 checks that a node's operands are F32 (the shaders read no other encoding) and that
// it has between lo and hi sources.
func gnF32(op string, n vulkanNode, lo, hi int) error {
	if len(n.Src) < lo || len(n.Src) > hi {
		return fmt.Errorf("%s with %d sources (want %d to %d)", op, len(n.Src), lo, hi)
	}
	if n.DstType != F32 {
		return fmt.Errorf("%s into a %s tensor: the shader writes F32", op, dtypeName(n.DstType))
	}
	for i, dt := range n.SrcType {
		if dt != F32 {
			return fmt.Errorf("%s on a %s source %d: the shader takes F32", op, dtypeName(dt), i)
		}
	}
	return nil
}

func gnLowerGroupNorm(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := gnF32("GroupNorm", n, 1, 3); err != nil {
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
	if err := gnF32("ChannelAffine", n, 2, 3); err != nil {
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
	if err := gnF32("SnakeBeta", n, 3, 3); err != nil {
		return nil, err
	}
	d, err := vulkan.SnakeBetaOp(n.Src[0], n.Src[1], n.Src[2], n.Dst)
	return []vulkan.Dispatch{d}, err
}
