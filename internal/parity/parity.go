// Package parity compares engine outputs with golden reference tensors, stage by stage, for
// the parity tests and the `voxpipe golden` command. It returns stages and errors and does
// not import `testing` (the binary links it); the test helpers are in paritytest.
package parity

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/voxpipe/voxpipe/engine/gguf"
)

// Stage is one compared golden tensor: the error of what the engine computed against what
// the reference produced.
type Stage struct {
	Name   string
	MaxAbs float64 // max |got − want|
	Rel    float64 // MaxAbs / max |want| (0 when want is all zeros and got equals it)
	Tol    float64 // allowed Rel; 0 means exact
	Err    string  // why the stage could not run or does not match (shape, length, ...)
}

// OK reports whether the stage passed.
func (s Stage) OK() bool { return s.Err == "" && s.Rel <= s.Tol }

// String is one report line: name, errors, tolerance and verdict.
func (s Stage) String() string {
	verdict := "ok"
	if !s.OK() {
		verdict = "FAIL"
	}
	if s.Err != "" {
		return fmt.Sprintf("%-4s %-44s %s", verdict, s.Name, s.Err)
	}
	var tol string
	switch m := fmt.Sprintf("%.3e", s.Tol); {
	case s.Tol == 0:
		tol = "exact"
	case strings.HasPrefix(m[1:], ".000e"):
		tol = fmt.Sprintf("tol %.0e", s.Tol) // a round tolerance such as 1e-04
	default:
		tol = "tol " + m // derived from a documented figure: one digit would misstate it
	}
	return fmt.Sprintf("%-4s %-44s max-abs %.3e  rel %.3e  %s", verdict, s.Name, s.MaxAbs, s.Rel, tol)
}

// Run checks one family's cases file: model code reads inputs and expected tensors through
// it and records a Stage per comparison. It remembers which cases were read so that Finish
// can fail on cases nobody checked (a newer golden folder than the code).
type Run struct {
	Family string
	Dir    string // the family's folder: model.gguf and cases.gguf
	Cases  *gguf.Model
	// Model, when set, is the model file to check instead of the folder's model.gguf (an
	// imported or re-encoded copy).
	Model string
	// MinTol raises every float stage's tolerance to at least this relative error: the
	// stated error of a quantised copy of the model.
	MinTol float64
	used   map[string]bool
	stages []Stage
}

// Open opens DIR/family/cases.gguf.
func Open(dir, family string) (*Run, error) {
	fd := filepath.Join(dir, family)
	c, err := gguf.OpenModel(filepath.Join(fd, "cases.gguf"))
	if err != nil {
		return nil, fmt.Errorf("golden %s: %w", family, err)
	}
	return &Run{Family: family, Dir: fd, Cases: c, used: map[string]bool{}}, nil
}

// ModelPath is DIR/family/model.gguf, or Model when set.
func (r *Run) ModelPath() string {
	if r.Model != "" {
		return r.Model
	}
	return filepath.Join(r.Dir, "model.gguf")
}

// Close releases the cases file.
func (r *Run) Close() { r.Cases.Close() }

// Has reports whether the cases file holds name (without marking it used).
func (r *Run) Has(name string) bool { return r.Cases.Has(name) }

// Names lists the case tensors whose names start with prefix.
func (r *Run) Names(prefix string) []string {
	var out []string
	for _, n := range r.Cases.Names() {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// Use marks cases as consumed without reading them (documentation-only tensors).
func (r *Run) Use(names ...string) {
	for _, n := range names {
		r.used[n] = true
	}
}

// F32 reads a float tensor and its shape (PyTorch order) and marks it used.
func (r *Run) F32(name string) ([]float32, []int, error) {
	r.used[name] = true
	return r.Cases.Get(name)
}

// I32 reads an int32 tensor and marks it used.
func (r *Run) I32(name string) ([]int32, error) {
	r.used[name] = true
	v, _, err := r.Cases.GetInt32(name)
	return v, err
}

// Add records a stage measured elsewhere (a figure computed once and checked here).
func (r *Run) Add(s Stage) Stage {
	r.used[s.Name] = true
	r.stages = append(r.stages, s)
	return s
}

// Fail records a stage that could not be computed.
func (r *Run) Fail(name string, err error) {
	r.Add(Stage{Name: name, Err: err.Error()})
}

// Compare records got against want under name with a relative tolerance.
func (r *Run) Compare(name string, got, want []float32, tol float64) Stage {
	return r.Add(Compare(name, got, want, max(tol, r.MinTol)))
}

// Check compares got with the case tensor of the same name.
func (r *Run) Check(name string, got []float32, tol float64) Stage {
	want, _, err := r.F32(name)
	if err != nil {
		r.Fail(name, err)
		return r.stages[len(r.stages)-1]
	}
	return r.Compare(name, got, want, tol)
}

// CheckI32 compares integer results exactly with the case tensor of the same name.
func (r *Run) CheckI32(name string, got []int32) Stage {
	want, err := r.I32(name)
	if err != nil {
		return r.Add(Stage{Name: name, Err: err.Error()})
	}
	return r.Add(CompareI32(name, got, want))
}

// CompareI32 is the stage of integer results got against want, exactly.
func CompareI32(name string, got, want []int32) Stage {
	s := Stage{Name: name}
	switch {
	case len(got) != len(want):
		s.Err = fmt.Sprintf("length %d, want %d", len(got), len(want))
	default:
		for i := range got {
			if got[i] != want[i] {
				s.MaxAbs = max(s.MaxAbs, math.Abs(float64(got[i])-float64(want[i])))
				if s.Err == "" {
					s.Err = fmt.Sprintf("element %d is %d, want %d", i, got[i], want[i])
				}
			}
		}
	}
	return s
}

// Stages are the stages recorded so far.
func (r *Run) Stages() []Stage { return r.stages }

// Finish returns every stage, with a failing one appended for each case tensor that no
// check read.
func (r *Run) Finish() []Stage {
	names := r.Cases.Names()
	slices.Sort(names)
	for _, n := range names {
		if !r.used[n] {
			r.stages = append(r.stages, Stage{Name: n, Err: "unknown case: no check reads it"})
		}
	}
	return r.stages
}

// Compare is max |got − want| and that relative to max |want|.
func Compare(name string, got, want []float32, tol float64) Stage {
	s := Stage{Name: name, Tol: tol}
	if len(got) != len(want) {
		s.Err = fmt.Sprintf("length %d, want %d", len(got), len(want))
		return s
	}
	var peak float64
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			s.Err = fmt.Sprintf("NaN at element %d", i)
			return s
		}
		s.MaxAbs = max(s.MaxAbs, d)
		peak = max(peak, math.Abs(float64(want[i])))
	}
	switch {
	case peak > 0:
		s.Rel = s.MaxAbs / peak
	case s.MaxAbs > 0:
		s.Rel = math.Inf(1)
	}
	return s
}
