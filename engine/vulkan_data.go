package engine

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/cgo"
	"github.com/voxpipe/voxpipe/vulkan"
)

func init() {
	vulkanLowerings[cgo.OpPad] = dmLowerPad
	vulkanLowerings[cgo.OpInterpLinear] = dmLowerInterp
	vulkanLowerings[cgo.OpScatterRows] = dmLowerScatter
	vulkanLowerings[cgo.OpReduce] = dmLowerReduce
	vulkanLowerings[cgo.OpCumsum] = dmLowerCumsum
}

// dmSources checks a node's source count.
func dmSources(op string, n vulkanNode, want int) error {
	if len(n.Src) != want || len(n.SrcType) != want {
		return fmt.Errorf("%s with %d sources (want %d)", op, len(n.Src), want)
	}
	return nil
}

// dmWords checks that a data-movement node moves 32-bit words of one type (F32 or I32) from
// src into dst.
func dmWords(op string, src, dst DType) error {
	if src != dst || (dst != F32 && dst != I32) {
		return fmt.Errorf("%s from %s into %s: the shader moves F32 or I32 values of one type", op, dtypeName(src), dtypeName(dst))
	}
	return nil
}

func dmLowerPad(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := dmSources("Pad", n, 1); err != nil {
		return nil, err
	}
	if err := dmWords("Pad", n.SrcType[0], n.DstType); err != nil {
		return nil, err
	}
	fill := math.Float32bits(n.FP[0])
	if n.DstType == I32 {
		fill = uint32(int32(n.FP[0])) // the CPU kernel's (int32_t) of the value
	}
	d, err := vulkan.PadOp(n.Src[0], n.Dst, int(n.IP[0]), n.IP[1], n.IP[2], int(n.IP[3]), fill)
	return []vulkan.Dispatch{d}, err
}

func dmLowerInterp(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("InterpLinear", 1, 1); err != nil {
		return nil, err
	}
	d, err := vulkan.InterpLinearOp(n.Src[0], n.Dst)
	return []vulkan.Dispatch{d}, err
}

// dmLowerScatter writes into the node's destination, the table itself (a persistent buffer
// or a view of one): the rows persist across runs. An index outside the table skips its row
// (the CPU backend fails the run).
func dmLowerScatter(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := dmSources("ScatterRows", n, 2); err != nil {
		return nil, err
	}
	if err := dmWords("ScatterRows", n.SrcType[0], n.DstType); err != nil {
		return nil, err
	}
	if n.SrcType[1] != I32 {
		return nil, fmt.Errorf("ScatterRows with %s indices: the shader takes I32", dtypeName(n.SrcType[1]))
	}
	d, err := vulkan.ScatterRowsOp(n.Src[0], n.Src[1], n.Dst)
	return []vulkan.Dispatch{d}, err
}

func dmLowerReduce(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("Reduce", 1, 1); err != nil {
		return nil, err
	}
	d, err := vulkan.ReduceOp(int(n.IP[1]), n.Src[0], n.Dst, int(n.IP[0]))
	return []vulkan.Dispatch{d}, err
}

func dmLowerCumsum(n vulkanNode) ([]vulkan.Dispatch, error) {
	if err := n.f32("Cumsum", 1, 1); err != nil {
		return nil, err
	}
	d, err := vulkan.CumsumOp(n.Src[0], n.Dst, int(n.IP[0]))
	return []vulkan.Dispatch{d}, err
}
