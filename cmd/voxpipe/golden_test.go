package main

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/internal/vulkantest"
)

// rewriteCases copies a family's golden folder, letting edit change the cases' tensors.
func rewriteCases(t *testing.T, family string, edit func([]gguf.WriteTensor) []gguf.WriteTensor) string {
	t.Helper()
	src := golden.Path(t, family)
	root := t.TempDir()
	dst := filepath.Join(root, family)
	os.MkdirAll(dst, 0o755)
	if err := os.Symlink(filepath.Join(src, "model.gguf"), filepath.Join(dst, "model.gguf")); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(filepath.Join(src, "cases.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []gguf.WriteTensor
	for _, ti := range f.Tensors {
		raw, info, err := f.TensorData(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, Shape: info.Shape(), Type: info.Type, Raw: raw})
	}
	out, err := os.Create(filepath.Join(dst, "cases.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := gguf.Write(out, f.KV, edit(ts)); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestGoldenCommand(t *testing.T) {
	golden.Path(t, "miotts")
	stdout, stderr, code := runCmd(t, "golden", "--family", "miotts")
	if code != 0 || !strings.Contains(stdout, "0 failed") || !strings.Contains(stdout, "lm.greedy.ids") {
		t.Fatalf("golden miotts: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// A case nobody checks fails the run, and so does a stage whose expected values differ.
	extra := rewriteCases(t, "miotts", func(ts []gguf.WriteTensor) []gguf.WriteTensor {
		return append(ts, gguf.WriteTensor{Name: "lm.future.case", Shape: []int{2}, Data: []float32{1, 2}})
	})
	stdout, _, code = runCmd(t, "golden", "--family", "miotts", "--dir", extra)
	if code == 0 || !strings.Contains(stdout, "FAIL lm.future.case") || !strings.Contains(stdout, "unknown case") {
		t.Errorf("unknown case: exit %d\n%s", code, stdout)
	}
	wrong := rewriteCases(t, "miotts", func(ts []gguf.WriteTensor) []gguf.WriteTensor {
		for i, tt := range ts {
			if tt.Name == "lm.prefill.logits_full" {
				raw := append([]byte(nil), tt.Raw...)
				v := math.Float32frombits(binary.LittleEndian.Uint32(raw))
				binary.LittleEndian.PutUint32(raw, math.Float32bits(v+1))
				ts[i].Raw = raw
			}
		}
		return ts
	})
	stdout, _, code = runCmd(t, "golden", "--family", "miotts", "--dir", wrong)
	if code == 0 || !strings.Contains(stdout, "FAIL lm.prefill.logits_full") {
		t.Errorf("changed expectation: exit %d\n%s", code, stdout)
	}
	if _, stderr, code := runCmd(t, "golden", "--family", "nope"); code == 0 || !strings.Contains(stderr, "meanvc2, meanvc2_40ms, miocodec, miotts") {
		t.Errorf("unknown family: exit %d %s", code, stderr)
	}
	if _, stderr, code := runCmd(t, "golden", "--family", "miotts", "--dir", t.TempDir()); code == 0 || !strings.Contains(stderr, "cases.gguf") {
		t.Errorf("missing folder: exit %d %s", code, stderr)
	}
}

// The shipped binary links no test harness: neither `testing` nor a testing/... package is
// among ./cmd/voxpipe's dependencies. What the commands run (golden checks, benchmarks)
// returns results and errors; helpers that need a *testing.T live in _test files or in
// test-only packages such as internal/parity/paritytest.
func TestBinaryLinksNoTesting(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go tool is not on PATH (%v): cannot list the binary's dependencies", err)
	}
	// Each dependency with its imports, to name the package that pulls testing in.
	cmd := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", ".")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	isTesting := func(p string) bool { return p == "testing" || strings.HasPrefix(p, "testing/") }
	var deps, importers []string
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		deps = append(deps, f[0])
		if !isTesting(f[0]) && slices.ContainsFunc(f[1:], isTesting) {
			importers = append(importers, f[0])
		}
	}
	if !slices.Contains(deps, "github.com/voxpipe/voxpipe/internal/parity") {
		t.Fatalf("go list -deps lists no internal/parity (%d packages): not the binary's dependencies?", len(deps))
	}
	if bad := slices.DeleteFunc(slices.Clone(deps), func(p string) bool { return !isTesting(p) }); len(bad) > 0 {
		t.Errorf("the binary links %v, imported by %v", bad, importers)
	}
}

// `golden --family meanvc2_40ms` runs the 40 ms + 40 ms model's folder through the same code
// as meanvc2's, and every stage passes.
func TestGoldenMeanVC2Variants(t *testing.T) {
	for _, family := range []string{"meanvc2", "meanvc2_40ms"} {
		golden.Path(t, family)
		stdout, stderr, code := runCmd(t, "golden", "--family", family)
		if code != 0 || !strings.Contains(stdout, family+": ") || !strings.Contains(stdout, " 0 failed") {
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			t.Errorf("golden --family %s: exit %d\n%s\n%s", family, code, lines[len(lines)-1], stderr)
		}
	}
}

// Every golden family passes every stage with its model on Vulkan (lavapipe in CI): the
// shaders, the backend's lowering and the models' device-side buffers together.
func TestGoldenVulkan(t *testing.T) {
	vulkantest.Require(t)
	for family := range goldenFamilies {
		t.Run(family, func(t *testing.T) {
			golden.Path(t, family)
			stdout, stderr, code := runCmd(t, "golden", "--family", family, "--backend", "vulkan")
			if code != 0 || !strings.Contains(stdout, " 0 failed") || !strings.Contains(stdout, "on vulkan:") {
				t.Fatalf("golden %s on Vulkan: exit %d\n%s\n%s", family, code, stdout, stderr)
			}
			t.Log(stdout[strings.LastIndex(strings.TrimSpace(stdout), "\n")+1:])
		})
	}
}
