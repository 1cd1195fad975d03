// Package worker makes voxpipe a LiveKit participant: `voxpipe worker` registers with a
// LiveKit server as an agent worker, takes the rooms LiveKit dispatches to it (or that its
// HTTP API is asked to join), converts the microphones in them with a voice (or speaks text
// into them), and reports its load so that LiveKit dispatches to the least loaded worker.
// The media path is the one WebRTC sessions use (rtc.Pipe, rtc.Speaker) on the same
// scheduler; LiveKit does the rooms, routing, SIP and scale-out.
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/livekit/protocol/auth"
	"github.com/livekit/protocol/livekit"
	"golang.org/x/time/rate"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/rtc"
	vxauth "github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/stream"
)

// Config sets up a Worker. URL, APIKey and APISecret are required; zero fields take the
// defaults.
type Config struct {
	URL       string // the LiveKit server: ws://, wss://, http:// or https://
	APIKey    string
	APISecret string
	// AgentName is the name dispatch rules and explicit dispatches use. Empty: LiveKit
	// dispatches every new room to the worker automatically.
	AgentName string
	Version   string // reported to LiveKit

	Voices       *stream.Registry // default stream.NewRegistry()
	NewProcessor func(owner, voice, ref string) (stream.Processor, error)
	DefaultVoice string            // default "dsp"
	Scheduler    *stream.Scheduler // default: one the worker makes and closes
	Synthesizers *stream.Synthesizers
	TTSAdmission func(model string) *stream.Admission
	// Owner is the principal whose library voices rooms may use (default the admin: a
	// worker serves one LiveKit project).
	Owner string

	MaxRooms  int // rooms at once (default 64)
	MaxTracks int // microphones converted at once, all rooms together (default 32)
	Jitter    buffers.JitterConfig
	Encoder   rtc.EncoderConfig
	MaxQueue  time.Duration
	Logger    *slog.Logger
	OnStats   func(rtc.SessionReport) // every conversion's once-a-second report
	// StatusInterval is how often the load is reported to LiveKit (default 2.5 s).
	StatusInterval time.Duration
}

// Worker is voxpipe in LiveKit rooms.
type Worker struct {
	cfg      Config
	voices   stream.VoiceSource
	sched    *stream.Scheduler
	ownSched bool
	ctx      context.Context
	cancel   context.CancelFunc

	mu       sync.Mutex
	rooms    map[*Room]struct{}
	tracks   int
	pending  int                    // jobs accepted but not yet joined
	offers   map[string]*time.Timer // accepted jobs awaiting their assignment
	limiters map[string]*rate.Limiter
	workerID string // from LiveKit, once registered
	agentErr error  // the last registration failure
}

// New checks cfg and makes a worker; Run registers it with LiveKit, Close ends it.
func New(cfg Config) (*Worker, error) {
	if cfg.URL == "" || cfg.APIKey == "" || cfg.APISecret == "" {
		return nil, errors.New("worker: the LiveKit URL, API key and API secret are required")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || !strings.Contains("ws wss http https", u.Scheme) || u.Scheme == "" {
		return nil, fmt.Errorf("worker: LiveKit URL %q: want ws://, wss://, http:// or https://HOST[:PORT]", cfg.URL)
	}
	if cfg.Voices == nil {
		cfg.Voices = stream.NewRegistry()
	}
	if cfg.DefaultVoice == "" {
		cfg.DefaultVoice = "dsp"
	}
	if cfg.Owner == "" {
		cfg.Owner = vxauth.Admin
	}
	if cfg.MaxRooms <= 0 {
		cfg.MaxRooms = 64
	}
	if cfg.MaxTracks <= 0 {
		cfg.MaxTracks = 32
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = 2500 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	quietSDK(cfg.Logger)
	w := &Worker{cfg: cfg, sched: cfg.Scheduler, rooms: map[*Room]struct{}{}, limiters: map[string]*rate.Limiter{}}
	if w.sched == nil {
		w.sched, w.ownSched = stream.NewScheduler(0), true
	}
	w.voices = stream.VoiceSource{Registry: cfg.Voices, NewProcessor: cfg.NewProcessor, Scheduler: w.sched}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w, nil
}

// Close leaves every room and stops the worker.
func (w *Worker) Close() {
	w.cancel()
	for _, r := range w.Rooms() {
		r.leave("worker closing")
	}
	if w.ownSched {
		w.sched.Close()
	}
}

// Rooms lists the rooms the worker is in.
func (w *Worker) Rooms() []*Room {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*Room, 0, len(w.rooms))
	for r := range w.rooms {
		out = append(out, r)
	}
	return out
}

// Join joins a room by name (the HTTP API's way in: the worker makes its own token).
func (w *Worker) Join(name string, opts Options) (*Room, error) {
	if err := opts.check(); err != nil {
		return nil, stream.Mark(err, stream.ErrBadParams)
	}
	if name == "" || len(name) > 256 {
		return nil, stream.Mark(errors.New("a room name of 1 to 256 bytes is required"), stream.ErrBadParams)
	}
	if !w.admit(opts.liveVoice(w.cfg.DefaultVoice)) {
		return nil, fmt.Errorf("this worker is full (%w)", stream.ErrBusy)
	}
	defer w.admitted()
	token, err := w.token(name, "voxpipe-"+randomID())
	if err != nil {
		return nil, err
	}
	return w.enter(w.cfg.URL, token, name, "", opts, nil)
}

// enter joins and registers a room.
func (w *Worker) enter(url, token, name, job string, opts Options, onLeave func()) (*Room, error) {
	r, err := w.join(url, token, name, job, opts, onLeave)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.rooms[r] = struct{}{}
	w.mu.Unlock()
	return r, nil
}

// Leave leaves every room of that name the worker is in; false if it is in none.
func (w *Worker) Leave(name string) bool {
	found := false
	for _, r := range w.Rooms() {
		if r.name == name {
			r.leave("asked to leave")
			found = true
		}
	}
	return found
}

// token is an access token to join room as identity, marked as an agent so that other
// workers never convert the worker's own tracks.
func (w *Worker) token(room, identity string) (string, error) {
	return auth.NewAccessToken(w.cfg.APIKey, w.cfg.APISecret).
		SetVideoGrant(&auth.VideoGrant{RoomJoin: true, Room: room}).
		SetIdentity(identity).SetName("voxpipe").SetKind(livekit.ParticipantInfo_AGENT).
		SetValidFor(time.Hour).ToJWT()
}

// admit reserves a room for a job about to join with voice ("" for none); false when the
// worker is full or the voice would not fit on the scheduler (stream.Scheduler.Admit).
func (w *Worker) admit(voice string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.rooms)+w.pending >= w.cfg.MaxRooms || !w.sched.Admit(voice, nil, nil) || w.ctx.Err() != nil {
		return false
	}
	w.pending++
	return true
}

func (w *Worker) admitted() {
	w.mu.Lock()
	w.pending--
	w.mu.Unlock()
}

// reserve takes one of the MaxTracks conversions.
func (w *Worker) reserve() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tracks >= w.cfg.MaxTracks {
		return false
	}
	w.tracks++
	return true
}

func (w *Worker) unreserve() {
	w.mu.Lock()
	w.tracks--
	w.mu.Unlock()
}

// forget drops a room that has been left.
func (w *Worker) forget(r *Room) {
	w.mu.Lock()
	delete(w.rooms, r)
	for k := range w.limiters {
		if strings.HasPrefix(k, r.name+"/") {
			delete(w.limiters, k)
		}
	}
	w.mu.Unlock()
}

// limit rate-limits the data messages of one sender in one room: 10 a second, bursts of 20.
func (w *Worker) limit(key string) bool {
	w.mu.Lock()
	l := w.limiters[key]
	if l == nil {
		if len(w.limiters) > 4096 {
			clear(w.limiters)
		}
		l = rate.NewLimiter(10, 20)
		w.limiters[key] = l
	}
	w.mu.Unlock()
	return l.Allow()
}

// Capacity is the worker's load as GET /v1/capacity and LiveKit see it.
type Capacity struct {
	Rooms     int     `json:"rooms"`
	MaxRooms  int     `json:"max_rooms"`
	Tracks    int     `json:"tracks"` // microphones being converted
	MaxTracks int     `json:"max_tracks"`
	Scheduler float64 `json:"scheduler_load"` // the model workers' busy fraction
	// Expected is the scheduler load the open conversions would make if all of them spoke
	// (their voices' learned costs).
	Expected float64 `json:"scheduler_expected_load"`
	// Load is what LiveKit's dispatch weighs workers by (0 idle … 1 full): the largest of
	// rooms, tracks and the scheduler's load (measured or expected), each over its limit.
	Load       float64 `json:"load"`
	Accepting  bool    `json:"accepting"`
	Registered bool    `json:"registered"` // registered with LiveKit as an agent worker
}

// Capacity reports the worker's load.
func (w *Worker) Capacity() Capacity {
	st := w.sched.Stats()
	w.mu.Lock()
	c := Capacity{Rooms: len(w.rooms) + w.pending, MaxRooms: w.cfg.MaxRooms, Tracks: w.tracks, MaxTracks: w.cfg.MaxTracks,
		Scheduler: st.Load, Expected: st.ExpectedLoad, Registered: w.workerID != ""}
	w.mu.Unlock()
	c.Load = min(1, max(float64(c.Rooms)/float64(c.MaxRooms), float64(c.Tracks)/float64(c.MaxTracks), max(st.Load, st.ExpectedLoad)/stream.SaturatedLoad))
	c.Accepting = c.Rooms < c.MaxRooms && c.Tracks < c.MaxTracks && w.sched.Admit(w.cfg.DefaultVoice, nil, nil) && w.ctx.Err() == nil
	return c
}

func randomID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
