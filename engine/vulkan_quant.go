package engine

import (
	"fmt"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

func init() {
	vulkanLowerings[cgo.OpLinearQ] = lqLowerLinear
	vulkanLowerings[cgo.OpGatherRows] = lqLowerGather
}

// lqEncoding is the shaders' encoding of a weight or table dtype; Q8_0R8 and F32P are the
// CPU kernels' repacks, which no shader reads.
func lqEncoding(op string, dt DType) (vulkan.Encoding, error) {
	switch dt {
	case Q8_0, F16, BF16, Q4_K:
		return vulkan.Encoding(dt), nil
	case Q8_0R8, F32P, F16P:
		return 0, fmt.Errorf("%s: a %s weight is the CPU's repacked layout; on Vulkan load it as stored in the file (Q8_0, F32 or F16)", op, dtypeName(dt))
	}
	return 0, fmt.Errorf("%s: weights in %s have no Vulkan shader (F16, BF16, Q8_0, Q4_K)", op, dtypeName(dt))
}

// lqLowerLinear: x [.., K] F32, W [N, K] in its file encoding, bias [N] F32 optional. ip[0]
// (row groups) does not matter here: each output row is computed the same way at any M.
func lqLowerLinear(n vulkanNode) ([]vulkan.Dispatch, error) {
	const op = "Linear"
	if len(n.Src) < 2 || len(n.Src) > 3 {
		return nil, fmt.Errorf("%s with %d sources (want x, W and an optional bias)", op, len(n.Src))
	}
	enc, err := lqEncoding(op, n.SrcType[1])
	if err != nil {
		return nil, err
	}
	if n.SrcType[0] != F32 || n.DstType != F32 {
		return nil, fmt.Errorf("%s of a %s input into %s: the shader takes and writes F32", op, dtypeName(n.SrcType[0]), dtypeName(n.DstType))
	}
	var bias *vulkan.Tensor
	if len(n.Src) == 3 {
		if n.SrcType[2] != F32 {
			return nil, fmt.Errorf("%s with a %s bias: the shader takes F32", op, dtypeName(n.SrcType[2]))
		}
		bias = &n.Src[2]
	}
	d, err := vulkan.LinearQOp(n.Src[0], n.Src[1], enc, bias, n.Dst)
	if err != nil {
		return nil, err
	}
	return []vulkan.Dispatch{d}, nil
}

// lqLowerGather: a table [N, D] (F32 or I32, or F16, BF16, Q8_0, Q4_K dequantised to F32)
// and I32 indices.
func lqLowerGather(n vulkanNode) ([]vulkan.Dispatch, error) {
	d, err := lqGather(n, 0, 0)
	if err != nil {
		return nil, err
	}
	return []vulkan.Dispatch{d}, nil
}

// lqGather is GatherRows from a table's rows [first, first+N) of all (all 0: the table is
// whole); see vulkan.GatherRowsPartOp.
func lqGather(n vulkanNode, first, all int64) (vulkan.Dispatch, error) {
	const op = "GatherRows"
	if len(n.Src) != 2 {
		return vulkan.Dispatch{}, fmt.Errorf("%s with %d sources (want a table and indices)", op, len(n.Src))
	}
	if n.SrcType[1] != I32 {
		return vulkan.Dispatch{}, fmt.Errorf("%s with %s indices: the shader takes I32", op, dtypeName(n.SrcType[1]))
	}
	tt, want := n.SrcType[0], F32
	var enc vulkan.Encoding
	switch tt {
	case F32, I32:
		enc, want = vulkan.Encoding(tt), tt
	default:
		var err error
		if enc, err = lqEncoding(op, tt); err != nil {
			return vulkan.Dispatch{}, err
		}
	}
	if n.DstType != want {
		return vulkan.Dispatch{}, fmt.Errorf("%s from a %s table into %s: the shader writes %s", op, dtypeName(tt), dtypeName(n.DstType), dtypeName(want))
	}
	return vulkan.GatherRowsPartOp(n.Src[0], enc, first, all, n.Src[1], n.Dst)
}
