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
// target the client sees) becomes the wanted offset.
func (o *obsSync) Stats(r rtc.SessionReport) {
	if r.Stream.Latency <= 0 {
		return
	}
	d := r.Stream.Latency + r.JitterTarget
	o.mu.Lock()
	o.pending = d.Round(time.Millisecond)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
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
