package main

import (
	"os/exec"
	"strings"
	"testing"
)

// layerRules are docs/architecture.md's import rules: a package under the first prefix may
// not import any package under the others. server/auth (the identity every layer checks)
// and internal/ are leaves any layer may use.
var layerRules = []struct {
	pkg       string
	forbidden []string
}{
	{"engine", []string{"models", "stream", "voice", "rtc", "tts", "server", "cmd"}},
	{"cgo", []string{"engine", "models", "stream", "voice", "rtc", "tts", "server", "cmd"}},
	{"dsp", []string{"engine", "models", "stream", "voice", "rtc", "tts", "server", "cmd"}},
	{"buffers", []string{"engine", "models", "stream", "voice", "rtc", "tts", "server", "cmd"}},
	{"models", []string{"stream", "voice", "rtc", "tts", "server", "cmd"}},
	{"stream", []string{"engine", "models", "voice", "rtc", "tts", "server", "cmd"}},
	{"voice", []string{"rtc", "tts", "server/metrics", "cmd"}},
	{"rtc", []string{"tts", "telephony", "voice", "models", "engine", "server/metrics", "cmd"}},
	{"tts", []string{"rtc", "telephony", "voice", "models", "engine", "server/metrics", "cmd"}},
	{"telephony", []string{"rtc", "voice", "models", "engine", "server/metrics", "cmd"}},           // tts/audioout's μ-law is shared
	{"worker", []string{"tts", "telephony", "voice", "models", "engine", "server/metrics", "cmd"}}, // rtc's media path is shared
	{"server", []string{"cmd", "models", "engine"}},
	{"server/auth", []string{"engine", "models", "stream", "voice", "rtc", "tts", "cmd", "server/metrics"}},
}

// TestLayers fails when a package imports against the layering (non-test imports).
func TestLayers(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go tool is not on PATH (%v)", err)
	}
	const mod = "github.com/voxpipe/voxpipe/"
	out, err := exec.Command(goTool, "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	under := func(p, prefix string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }
	checked := 0
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(strings.ReplaceAll(line, mod, ""))
		if len(f) == 0 {
			continue
		}
		pkg := f[0]
		for _, r := range layerRules {
			// The most specific rule for pkg applies (server/auth, not server).
			if !under(pkg, r.pkg) || (r.pkg == "server" && under(pkg, "server/auth")) {
				continue
			}
			checked++
			for _, imp := range f[1:] {
				for _, bad := range r.forbidden {
					if under(imp, bad) {
						t.Errorf("%s imports %s: %s may not import %s (docs/architecture.md)", pkg, imp, r.pkg, bad)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d packages checked: go list output not understood", checked)
	}
}
