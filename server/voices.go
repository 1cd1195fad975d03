package server

import (
	"sync"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
)

// VoiceDetails describe a live voice whose processor is costly or impossible to make just
// to read its Info (a model voice needs a target voice): the server's owner computes them
// once, at startup.
type VoiceDetails struct {
	Info     stream.ProcessorInfo // what the voice's processors report
	NeedsRef bool                 // its target is a reference clip (the session's "ref")
	Label    string               // for people: "MeanVC2 40 ms (low latency)"
}

// LiveVoice is one entry of GET /v1/voices' "live_voices".
type LiveVoice struct {
	Name string `json:"name"`
	// AlgorithmicLatencyMs is what a session with this voice reports in its "ready" message
	// (rtc.Server.AlgorithmicLatency: the processing path's designed delay plus the initial
	// jitter target).
	AlgorithmicLatencyMs float64 `json:"algorithmic_latency_ms"`
	NeedsRef             bool    `json:"needs_ref"`
	Label                string  `json:"label"`
}

// builtinLabels name the voices every registry holds (stream.NewRegistry).
var builtinLabels = map[string]string{
	"dsp":         "DSP (pitch & formant)",
	"passthrough": "Passthrough (unchanged)",
}

// catalog lists the live voices with their details. A voice without given details is made
// once to read its Info (the built-in voices are cheap to make), and the result is kept.
type catalog struct {
	rtc     *rtc.Server
	voices  *stream.Registry
	details map[string]VoiceDetails

	mu    sync.Mutex
	known map[string]LiveVoice
}

func newCatalog(s *rtc.Server, voices *stream.Registry, details map[string]VoiceDetails) *catalog {
	c := &catalog{rtc: s, voices: voices, details: details, known: map[string]LiveVoice{}}
	c.list() // compute them now, not on a client's request
	return c
}

// list returns every registered voice's entry, in the registry's order.
func (c *catalog) list() []LiveVoice {
	if c.voices == nil || c.rtc == nil {
		return []LiveVoice{}
	}
	names := c.voices.Names()
	out := make([]LiveVoice, 0, len(names))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range names {
		v, ok := c.known[name]
		if !ok {
			v = c.entry(name)
			c.known[name] = v
		}
		out = append(out, v)
	}
	return out
}

// entry builds a voice's entry; c.mu is held.
func (c *catalog) entry(name string) LiveVoice {
	d, ok := c.details[name]
	if !ok {
		d.Label = builtinLabels[name]
		p, err := c.voices.New(name)
		if err != nil {
			// Listed without a latency rather than not at all: sessions may still pick it
			// and get the error that says why.
			return LiveVoice{Name: name, Label: labelOr(d.Label, name)}
		}
		d.Info = p.Info()
		stream.CloseProcessor(p)
	}
	v := LiveVoice{Name: name, NeedsRef: d.NeedsRef, Label: labelOr(d.Label, name)}
	if d.Info.SampleRate > 0 {
		v.AlgorithmicLatencyMs = float64(c.rtc.AlgorithmicLatency(d.Info).Microseconds()) / 1000
	}
	return v
}

func labelOr(label, name string) string {
	if label == "" {
		return name
	}
	return label
}
