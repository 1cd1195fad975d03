package cgo

import "testing"

// ReadBandwidth reads every value of its buffer once per pass, on every SIMD path and thread
// count (the sum of the ones is the float count), and reports a rate.
func TestReadBandwidth(t *testing.T) {
	const mb = 3
	want := float64(mb << 20 / 4)
	for _, portable := range []bool{false, true} {
		ForcePortable(portable)
		for _, threads := range []int{1, 2, 3} {
			rate, sum, err := ReadBandwidth(threads, mb, 2)
			if err != nil {
				t.Fatal(err)
			}
			if sum != want || rate <= 0 {
				t.Errorf("portable %v, %d threads: sum %v (want %v), rate %v", portable, threads, sum, want, rate)
			}
		}
	}
	ForcePortable(false)
	if _, _, err := ReadBandwidth(0, 1, 1); err == nil {
		t.Error("0 threads accepted")
	}
}
