package main

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/obsws"
	"github.com/voxpipe/voxpipe/rtc"
)

// obsSync keeps an OBS input's audio sync offset at the live voice's measured latency
// (serve --obs ws://host:4455 --obs-input NAME; the password comes from $OBS_WEBSOCKET_PASSWORD).
type obsSync struct {
	url, input, password string
	log                  *slog.Logger

	mu      sync.Mutex
	client  *obsws.Client
	last    time.Duration // offset last set
	pending time.Duration
	wake    chan struct{}
}

func newOBSSync(ctx context.Context, url, input string, log *slog.Logger) *obsSync {
	o := &obsSync{url: url, input: input, password: os.Getenv("OBS_WEBSOCKET_PASSWORD"), log: log, wake: make(chan struct{}, 1)}
	go o.run(ctx)
	return o
}

// Stats is an rtc OnStats hook: a session's measured latency (server side plus the jitter
// target the client sees) becomes the wanted offset. Until a latency has been measured (the
// voice's first output is still on its way) its algorithmic latency stands in for it, so
// the offset fits the voice — 120 ms or 40 ms MeanVC2, the DSP voice — from the start.
func (o *obsSync) Stats(r rtc.SessionReport) {
	d := obsOffset(r)
	if d <= 0 {
		return
	}
	o.mu.Lock()
	o.pending = d.Round(time.Millisecond)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// obsOffset is the sync offset a session's report asks for: its measured latency, or its
// algorithmic latency while none is measured, plus the jitter target; 0 when the report has
// neither.
func obsOffset(r rtc.SessionReport) time.Duration {
	lat := r.Stream.Latency
	if lat <= 0 {
		lat = r.Algorithmic
	}
	if lat <= 0 {
		return 0
	}
	return lat + r.JitterTarget
}

// run applies changes of more than 10 ms, reconnecting when OBS goes away.
func (o *obsSync) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			if o.client != nil {
				o.client.Close()
			}
			return
		case <-o.wake:
		}
		o.mu.Lock()
		want := o.pending
		o.mu.Unlock()
		if d := want - o.last; d > -10*time.Millisecond && d < 10*time.Millisecond {
			continue
		}
		if o.client == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := obsws.Dial(cctx, o.url, o.password)
			cancel()
			if err != nil {
				o.log.Warn("obs: cannot connect", "err", err)
				continue
			}
			o.client = c
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := o.client.SetAudioSyncOffset(rctx, o.input, want)
		cancel()
		if err != nil {
			o.log.Warn("obs: set sync offset", "input", o.input, "err", err)
			o.client.Close()
			o.client = nil
			continue
		}
		o.last = want
		o.log.Info("obs: audio sync offset set", "input", o.input, "offset", want)
	}
}
