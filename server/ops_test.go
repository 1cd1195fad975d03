package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/server/metrics"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/tts"
	"github.com/voxpipe/voxpipe/voice/library"
)

// silentSynth is a TTS model that is never run: only its slots are.
type silentSynth struct{}

func (silentSynth) Info() stream.SynthInfo { return stream.SynthInfo{Name: "quiet", SampleRate: 24000} }
func (silentSynth) Synthesize(context.Context, stream.SynthRequest, func(stream.SynthChunk) error) error {
	return nil
}

// slowProc is a model voice whose chunks take longer than their audio.
type slowProc struct{ stream.Delay }

func (p *slowProc) Process(out, in []float32) ([]float32, error) {
	time.Sleep(30 * time.Millisecond)
	return p.Delay.Process(out, in)
}

// opsServer is the handler with API keys, one TTS model of 2 slots and a one-worker
// scheduler, and the parts a test drives.
type opsServer struct {
	url      string
	tts      *tts.Server
	sched    *stream.Scheduler
	draining atomic.Bool
}

func newOpsServer(t *testing.T) *opsServer {
	t.Helper()
	o := &opsServer{sched: stream.NewScheduler(1)}
	t.Cleanup(o.sched.Close)
	synths := &stream.Synthesizers{}
	synths.Register(silentSynth{})
	o.tts = tts.NewServer(tts.Config{Synthesizers: synths, DefaultSlots: 2, MaxWait: time.Minute})
	t.Cleanup(o.tts.Close)
	rs, err := rtc.NewServer(rtc.Config{Scheduler: o.sched})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	lib, _, err := library.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	keys, err := auth.NewKeys([]string{"client-key-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(New(Config{RTC: rs, TTS: o.tts, Library: lib, Voices: stream.NewRegistry(), Synthesizers: synths,
		Keys: keys, Metrics: metrics.New(), Scheduler: o.sched, Draining: o.draining.Load}))
	t.Cleanup(hs.Close)
	o.url = hs.URL
	return o
}

// get fetches path without a key and decodes its JSON.
func (o *opsServer) get(t *testing.T, path string, into any) int {
	t.Helper()
	resp, err := http.Get(o.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode
}

type readyBody struct {
	Status string
	Ready  bool
	Full   []string
}

// /readyz and /v1/capacity need no key and report real counts: idle, every TTS slot taken
// (full: 503, or 200 with ignore_load), a saturated scheduler, and draining (503 whatever
// the load). The capacity report carries no ids or owners.
func TestReadinessAndCapacity(t *testing.T) {
	o := newOpsServer(t)
	var r readyBody
	if code := o.get(t, "/readyz", &r); code != 200 || r.Status != "ok" || !r.Ready {
		t.Fatalf("idle /readyz: %d %+v", code, r)
	}
	var c Capacity
	if code := o.get(t, "/v1/capacity", &c); code != 200 || !c.Accepting || c.Status != "ok" || c.Load != 0 ||
		c.TTSSlots != 2 || c.TTS["quiet"].Slots != 2 || c.Scheduler == nil || c.Scheduler.Workers != 1 ||
		c.Scheduler.SaturatedLoad != stream.SaturatedLoad || c.LateChunks == nil || c.Calls != nil {
		t.Fatalf("idle capacity: %d %+v", code, c)
	}
	resp, _ := http.Get(o.url + "/v1/voices")
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("/v1/voices without a key: %d; the keys are not on", resp.StatusCode)
	}

	// One slot of two: half loaded, still ready. Both: full.
	adm := o.tts.Admission("quiet")
	rel1, _ := adm.Acquire(context.Background())
	if o.get(t, "/v1/capacity", &c); c.Load != 0.5 || c.TTSActive != 1 || !c.Accepting {
		t.Errorf("one slot taken: %+v", c)
	}
	rel2, _ := adm.Acquire(context.Background())
	if code := o.get(t, "/readyz", &r); code != 503 || r.Status != "full" || r.Ready || strings.Join(r.Full, ",") != "tts" {
		t.Errorf("every slot taken: /readyz %d %+v", code, r)
	}
	if code := o.get(t, "/readyz?ignore_load=1", &r); code != 200 || !r.Ready {
		t.Errorf("every slot taken, ignore_load: %d %+v", code, r)
	}
	if o.get(t, "/v1/capacity", &c); c.Load != 1 || c.Accepting || c.Status != "full" {
		t.Errorf("every slot taken: %+v", c)
	}
	rel1()
	rel2()

	// A model voice slower than real time saturates the one worker.
	p := &slowProc{Delay: *stream.NewDelay(16000, 160, 0)}
	l, err := o.sched.NewLive(stream.Config{IORate: 16000}, "slow", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.Push(make([]float32, 160), time.Now())
		time.Sleep(25 * time.Millisecond)
		if o.get(t, "/v1/capacity", &c); c.Scheduler.Saturated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduler never saturated: %+v", c.Scheduler)
		}
	}
	if c.Status != "full" || c.Load < stream.SaturatedLoad || c.Scheduler.Sessions != 1 {
		t.Errorf("saturated scheduler: %+v %+v", c, c.Scheduler)
	}
	if code := o.get(t, "/readyz", &r); code != 503 || strings.Join(r.Full, ",") != "scheduler" {
		t.Errorf("saturated scheduler: /readyz %d %+v", code, r)
	}

	// Draining: 503 with or without ignore_load; /healthz (liveness) stays 200.
	o.draining.Store(true)
	for _, path := range []string{"/readyz", "/readyz?ignore_load=1"} {
		if code := o.get(t, path, &r); code != 503 || r.Status != "draining" {
			t.Errorf("draining %s: %d %+v", path, code, r)
		}
	}
	var h map[string]any
	if code := o.get(t, "/healthz", &h); code != 200 || h["status"] != "ok" {
		t.Errorf("draining /healthz: %d %v", code, h)
	}
	raw, err := http.Get(o.url + "/v1/capacity")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Body.Close()
	var generic map[string]any
	json.NewDecoder(raw.Body).Decode(&generic)
	for k := range generic {
		if strings.Contains(k, "id") || strings.Contains(k, "owner") || strings.Contains(k, "key") {
			t.Errorf("capacity names %q", k)
		}
	}
	if raw.Header.Get("Cache-Control") != "no-store" || generic["accepting"] != false {
		t.Errorf("capacity while draining: %v %v", raw.Header, generic)
	}
}
