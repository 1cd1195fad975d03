package vulkan

import (
	"fmt"
	"math"
)

// elementGroups is the dispatch size for n elements in workgroups of 256 (the y axis takes
// what the x axis's 65 535 groups cannot).
func elementGroups(n int) [3]uint32 {
	g := (n + 255) / 256
	gx := min(g, 65535)
	return [3]uint32{uint32(max(gx, 1)), uint32(max((g+gx-1)/max(gx, 1), 1)), 1}
}

// Unary runs y = op(x) over the first n values; op is one of the engine's unary codes
// (cgo.UNeg … cgo.URecip), p0 and p1 are clamp's bounds and scale's factor and offset.
func (d *Device) Unary(op int, x, y *Buffer, n int, p0, p1 float32) error {
	if op < 0 || op > 16 || n < 0 || n > x.Len() || n > y.Len() {
		return fmt.Errorf("vulkan: unary op %d over %d values of buffers of %d and %d", op, n, x.Len(), y.Len())
	}
	p, err := d.shader("unary", 2, 16)
	if err != nil {
		return err
	}
	return d.dispatch("unary", p, []*Buffer{x, y}, []uint32{uint32(n), uint32(op), math.Float32bits(p0), math.Float32bits(p1)}, elementGroups(n))
}

// Binary runs y[i] = a[i] op b[i mod nb] over n values; op is one of the engine's binary
// codes (cgo.BAdd … cgo.BMin).
func (d *Device) Binary(op int, a, b, y *Buffer, n, nb int) error {
	if op < 0 || op > 5 || n < 0 || n > a.Len() || n > y.Len() || nb < 1 || nb > b.Len() {
		return fmt.Errorf("vulkan: binary over %d values (b repeating every %d) of buffers of %d, %d and %d", n, nb, a.Len(), b.Len(), y.Len())
	}
	p, err := d.shader("binary", 3, 12)
	if err != nil {
		return err
	}
	return d.dispatch("binary", p, []*Buffer{a, b, y}, []uint32{uint32(n), uint32(nb), uint32(op)}, elementGroups(n))
}

// Linear runs y[M, N] = x[M, K]·w[N, K]ᵀ + bias[N] (bias nil: none) with F32 weights.
func (d *Device) Linear(x, w, bias, y *Buffer, m, n, k int) error {
	if m < 0 || n < 1 || k < 1 || m*k > x.Len() || n*k > w.Len() || m*n > y.Len() || bias != nil && bias.Len() < n {
		return fmt.Errorf("vulkan: linear %d×%d×%d over buffers of %d, %d and %d values", m, k, n, x.Len(), w.Len(), y.Len())
	}
	if m == 0 {
		return nil
	}
	p, err := d.shader("linear", 4, 16)
	if err != nil {
		return err
	}
	has := uint32(1)
	if bias == nil {
		bias, has = w, 0 // bound but not read
	}
	groups := [3]uint32{uint32((n + 15) / 16), uint32((m + 15) / 16), 1}
	return d.dispatch("linear", p, []*Buffer{x, w, bias, y}, []uint32{uint32(m), uint32(n), uint32(k), has}, groups)
}
