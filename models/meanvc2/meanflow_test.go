package meanvc2

import (
	"math"
	"testing"
)

func TestUpsampleBN(t *testing.T) {
	// First window: 4 frames 0..3 → 17 aligned points over [0, 3], the first dropped.
	got := UpsampleBN(nil, []float32{0, 1, 2, 3}, 1, 16)
	for p, v := range got {
		if want := 3 * float64(p+1) / 16; math.Abs(float64(v)-want) > 1e-6 {
			t.Fatalf("point %d = %g, want %g", p+1, v, want)
		}
	}
	// Later windows start from the previous window's last frame: [3 ‖ 4 5 6 7] → 4+p/4.
	got = UpsampleBN([]float32{3}, []float32{4, 5, 6, 7}, 1, 16)
	for p, v := range got {
		if want := 3 + float64(p+1)/4; math.Abs(float64(v)-want) > 1e-6 {
			t.Fatalf("point %d = %g, want %g", p+1, v, want)
		}
	}
	if UpsampleBN(nil, []float32{1}, 1, 16) != nil {
		t.Error("one frame was upsampled (the reference skips it)")
	}
}

func TestCondBufferFlush(t *testing.T) {
	c := DefaultConfig()
	c.BNDim = 1
	frames := func(from, n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(from + i)
		}
		return out
	}
	for _, tc := range []struct {
		pushed int
		want   [][2]int // per cond: first frame, frames before the padding starts
	}{
		{16, [][2]int{{0, 16}, {12, 4}}},           // one step streams; flush: 4 left → padded chunk
		{24, [][2]int{{0, 16}, {12, 12}}},          // 12 left exactly → last frame ×4 as lookahead
		{32, [][2]int{{0, 16}, {12, 16}, {24, 8}}}, // real lookahead, then a partial chunk
	} {
		b := c.NewCondBuffer()
		b.Push(frames(0, tc.pushed))
		var conds [][]float32
		for {
			cnd, ok := b.Next()
			if !ok {
				break
			}
			conds = append(conds, cnd)
		}
		conds = append(conds, b.Flush()...)
		if len(conds) != len(tc.want) || b.Len() != 0 {
			t.Fatalf("%d frames: %d conditions (%d left), want %d", tc.pushed, len(conds), b.Len(), len(tc.want))
		}
		for i, cnd := range conds {
			first, real := tc.want[i][0], tc.want[i][1]
			if len(cnd) != c.Window() {
				t.Fatalf("%d frames: condition %d has %d frames", tc.pushed, i, len(cnd))
			}
			for k, v := range cnd {
				want := float32(first + min(k, real-1))
				if v != want {
					t.Fatalf("%d frames: condition %d frame %d = %g, want %g", tc.pushed, i, k, v, want)
				}
			}
		}
	}
}
