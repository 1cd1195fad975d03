package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/golden"
)

// actAsVoxpipe, set to 1 in the environment, makes the test binary run voxpipe's command
// line (TestMain): the benches start "this binary's serve command" (os.Executable), which
// under go test is the test binary, and the child inherits the variable.
const actAsVoxpipe = "VOXPIPE_TEST_ACT_AS_VOXPIPE"

func TestMain(m *testing.M) {
	if os.Getenv(actAsVoxpipe) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestSoakShort is the soak's short form: a minute of WebRTC sessions and TTS streams
// joining and leaving (some cancelled, some dropped without a goodbye) against a child
// server, whose goroutines, fds, RSS and heap must come back to where they were after the
// warm-up, with no unexpected error.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of load; -short skips it")
	}
	t.Setenv(actAsVoxpipe, "1")
	var log bytes.Buffer
	res, err := benchSoak(soakOptions{duration: time.Minute, sessions: 4, streams: 2, seed: 1,
		model: golden.Path(t, "miotts", "model.gguf"), codec: golden.Path(t, "miocodec", "model.gguf"),
		voice: fixture, slack: 200 * time.Millisecond, log: &log})
	if err != nil {
		t.Fatalf("%v\nserver log:\n%s", err, log.String())
	}
	var out strings.Builder
	printSoak(&out, res)
	t.Log("\n" + out.String())
	if !res.Flat {
		t.Errorf("not flat: %s\nserver log:\n%s", strings.Join(res.Problems, "; "), log.String())
	}
	// The churn really happened: every way of leaving was taken.
	if res.RTCSessions < 2*res.Sessions || res.RTCAborted == 0 || res.TTSStreams < 2*res.Streams ||
		res.TTSCanceled == 0 || res.TTSDropped == 0 || res.RTCChunks == 0 || res.TTSChunks == 0 {
		t.Errorf("too little churn: %+v", res)
	}
}

// The verdict catches what a leak leaves: a goroutine or an fd per session, or memory
// growing past 10 %; the small slack absorbs timers still winding down.
func TestSoakVerdict(t *testing.T) {
	start := resources{RSSBytes: 300 << 20, HeapBytes: 7 << 20, Goroutines: 12, FDs: 12}
	grow := func(f func(r *resources)) resources {
		r := start
		f(&r)
		return r
	}
	for _, c := range []struct {
		name string
		end  resources
		want string // a problem naming this, or "" for none
	}{
		{"same", start, ""},
		{"slack", grow(func(r *resources) { r.Goroutines += soakGoroutineSlack; r.FDs += soakFDSlack }), ""},
		{"goroutine per session", grow(func(r *resources) { r.Goroutines += 40 }), "goroutines"},
		{"fd per session", grow(func(r *resources) { r.FDs += 40 }), "open fds"},
		{"rss within", grow(func(r *resources) { r.RSSBytes *= 1.09 }), ""},
		{"rss", grow(func(r *resources) { r.RSSBytes *= 1.11 }), "RSS"},
		{"heap", grow(func(r *resources) { r.HeapBytes *= 1.11 }), "Go heap"},
		{"less", grow(func(r *resources) { r.Goroutines, r.RSSBytes = 8, 200<<20 }), ""},
	} {
		p := soakVerdict(start, c.end)
		if c.want == "" && len(p) > 0 || c.want != "" && (len(p) != 1 || !strings.Contains(p[0], c.want)) {
			t.Errorf("%s: %q, want a problem about %q", c.name, p, c.want)
		}
	}
}

func TestGoroutineGrowth(t *testing.T) {
	before := "goroutine profile: total 3\n2 @ 0x1 0x2\n#\t0x1\tmain.a+0x1\tx.go:1\n\n1 @ 0x3\n#\t0x3\tmain.b+0x1\tx.go:2\n"
	after := "goroutine profile: total 7\n2 @ 0x1 0x2\n#\t0x1\tmain.a+0x1\tx.go:1\n\n5 @ 0x3\n#\t0x3\tmain.b+0x1\tx.go:2\n"
	g := goroutineGrowth(before, after, 5)
	if len(g) != 1 || !strings.HasPrefix(g[0], "+4 (1 → 5)") || !strings.Contains(g[0], "main.b") {
		t.Errorf("%q", g)
	}
}
