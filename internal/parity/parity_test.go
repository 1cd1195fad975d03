package parity

import (
	"math"
	"strings"
	"testing"
)

func TestCompareAndReportLines(t *testing.T) {
	s := Compare("x", []float32{1, 2.5, -4}, []float32{1, 2, -4}, 0.1)
	if s.MaxAbs != 0.5 || s.Rel != 0.125 || s.OK() {
		t.Errorf("%+v", s)
	}
	if s := Compare("x", []float32{1}, []float32{1, 2}, 1); s.OK() || !strings.Contains(s.Err, "length 1, want 2") {
		t.Errorf("length: %+v", s)
	}
	if s := Compare("x", []float32{float32(math.NaN())}, []float32{1}, 1); s.OK() || !strings.Contains(s.Err, "NaN") {
		t.Errorf("NaN: %+v", s)
	}
	if s := Compare("x", []float32{1}, []float32{0}, 1); s.OK() || !math.IsInf(s.Rel, 1) {
		t.Errorf("zero expectation: %+v", s)
	}
	// Round tolerances keep one digit; one derived from a documented figure shows it whole.
	for tol, want := range map[float64]string{0: "exact", 1e-4: "tol 1e-04", 1.5e-4: "tol 1.500e-04", 4.10e-3 * 1.05: "tol 4.305e-03"} {
		if line := (Stage{Name: "s", Tol: tol}).String(); !strings.HasSuffix(line, want) || !strings.HasPrefix(line, "ok ") {
			t.Errorf("tol %g: %q, want suffix %q", tol, line, want)
		}
	}
}
