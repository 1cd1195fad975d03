package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/livekit/protocol/livekit"
	lksdk "github.com/livekit/server-sdk-go/v2"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
)

// DataTopic is the data-channel topic of the TTS agent: clients send speak and cancel
// messages on it and get the speaking, done and error events back on it.
const DataTopic = "voxpipe"

// opusTrack is the codec of every track the worker publishes.
var opusTrack = webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}

// Room is the worker in one LiveKit room: in vc mode one conversion per subscribed
// microphone, each published back as its own track; in tts mode one speaker track.
type Room struct {
	w       *Worker
	name    string
	job     string // the dispatch's job id ("" when joined through the HTTP API)
	opts    Options
	log     *slog.Logger
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc
	lk     *lksdk.Room
	done   chan struct{} // closed once the room is left and everything in it stopped

	onLeave func() // called once the room is left

	mu      sync.Mutex
	convs   map[string]*conversion // by the remote track's SID
	waiting map[string]bool        // tracks whose conversion is starting (or waits for capacity)
	speaker *rtc.Speaker
	wg      sync.WaitGroup
	ended   bool
}

// conversion is one remote microphone converted and published.
type conversion struct {
	identity string
	pipe     *rtc.Pipe
	live     *stream.Live
	track    *lksdk.LocalTrack
	pub      *lksdk.LocalTrackPublication
	cancel   context.CancelFunc
	done     chan struct{}
}

// sampleWriter adapts an SDK track to rtc.SampleWriter.
type sampleWriter struct{ t *lksdk.LocalTrack }

func (s sampleWriter) WriteSample(m media.Sample) error { return s.t.WriteSample(m, nil) }

// join connects to the room with token and starts what opts ask for; onLeave, if set, is
// called once the room has been left.
func (w *Worker) join(url, token, name, job string, opts Options, onLeave func()) (*Room, error) {
	ctx, cancel := context.WithCancel(w.ctx)
	r := &Room{w: w, name: name, job: job, opts: opts, onLeave: onLeave, started: time.Now(), ctx: ctx, cancel: cancel,
		convs: map[string]*conversion{}, waiting: map[string]bool{}, done: make(chan struct{}),
		log: w.cfg.Logger.With("room", name, "job", job, "mode", opts.Mode)}
	cb := lksdk.NewRoomCallback()
	cb.OnDisconnected = func() { go r.leave("disconnected") }
	if opts.Mode == ModeVC {
		cb.OnTrackSubscribed = r.trackSubscribed
		cb.OnTrackUnsubscribed = func(_ *webrtc.TrackRemote, pub *lksdk.RemoteTrackPublication, _ *lksdk.RemoteParticipant) {
			r.stopConversion(pub.SID())
		}
	} else {
		cb.OnDataPacket = r.dataPacket
	}
	// The room exists before it is joined: its callbacks may run before the join returns.
	r.lk = lksdk.NewRoom(cb)
	if err := r.lk.JoinWithToken(url, token, lksdk.WithAutoSubscribe(opts.Mode == ModeVC)); err != nil {
		cancel()
		return nil, fmt.Errorf("join room %q: %w", name, err)
	}
	if opts.Mode == ModeTTS {
		if err := r.startSpeaker(); err != nil {
			r.onLeave = nil // the caller reports the failure
			r.leave("tts failed")
			return nil, err
		}
	}
	r.log.Info("joined room")
	return r, nil
}

// trackSubscribed starts converting a microphone (an SDK callback).
func (r *Room) trackSubscribed(tr *webrtc.TrackRemote, pub *lksdk.RemoteTrackPublication, rp *lksdk.RemoteParticipant) {
	if tr.Kind() != webrtc.RTPCodecTypeAudio || rp.Kind() == lksdk.ParticipantAgent {
		return // another agent's track (ours included, seen by nobody else): never converted
	}
	if r.opts.Participant != "" && rp.Identity() != r.opts.Participant {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	sid := pub.SID()
	r.waiting[sid] = true
	// Off the SDK's goroutine: making a model voice (a speaker embedding) takes a while.
	r.wg.Go(func() { r.convert(tr, sid, rp.Identity()) })
}

// busyRetry is how often a track refused for want of capacity is tried again.
const busyRetry = 5 * time.Second

// convert starts converting a track; when the worker is busy it tries again every busyRetry
// for as long as the track stays subscribed, so that a microphone refused at a busy moment
// is converted once capacity frees up.
func (r *Room) convert(tr *webrtc.TrackRemote, sid, identity string) {
	defer func() {
		r.mu.Lock()
		delete(r.waiting, sid)
		r.mu.Unlock()
	}()
	for told := false; ; {
		err := r.startConversion(tr, sid, identity)
		if err == nil || errors.Is(err, errRoomClosing) {
			return
		}
		busy := errors.Is(err, stream.ErrBusy)
		if !told || !busy {
			code, msg := stream.ClientError(r.log, "conversion", err, stream.CodeInternal)
			if busy {
				msg += fmt.Sprintf(" (trying again every %v)", busyRetry)
			}
			r.log.Warn("cannot convert track", "participant", identity, "code", code, "err", msg)
			r.event(rtc.Message{Type: "error", Code: code, Message: fmt.Sprintf("%s: %s", identity, msg)})
			told = true
		}
		if !busy {
			return
		}
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(busyRetry):
		}
		r.mu.Lock()
		still := r.waiting[sid]
		r.mu.Unlock()
		if !still {
			return // unsubscribed meanwhile
		}
	}
}

func (r *Room) startConversion(tr *webrtc.TrackRemote, sid, identity string) (err error) {
	if !r.w.reserve() {
		return fmt.Errorf("this worker converts %d tracks already (%w)", r.w.cfg.MaxTracks, stream.ErrBusy)
	}
	defer func() {
		if err != nil {
			r.w.unreserve()
		}
	}()
	voice := r.opts.Voice
	if voice == "" {
		voice = r.w.cfg.DefaultVoice
	}
	proc, err := r.w.voices.Make(r.w.cfg.Owner, voice, r.opts.Ref, r.opts.Params)
	if err != nil {
		return err
	}
	log := r.log.With("participant", identity, "voice", voice)
	live, err := r.w.sched.NewLive(stream.Config{IORate: 48000, MaxQueue: r.w.cfg.MaxQueue}, voice, proc, log)
	if err != nil {
		stream.CloseProcessor(proc)
		return err
	}
	track, pub, err := r.publish("voxpipe:" + identity)
	if err != nil {
		live.Close()
		stream.CloseProcessor(proc)
		return err
	}
	ctx, cancel := context.WithCancel(r.ctx)
	c := &conversion{identity: identity, live: live, track: track, pub: pub, cancel: cancel, done: make(chan struct{}),
		pipe: rtc.NewPipe(rtc.PipeConfig{ID: r.name + "/" + identity, Jitter: r.w.cfg.Jitter, Encoder: r.w.cfg.Encoder, Log: log,
			OnStats: func(_ rtc.StatsMessage, rep rtc.SessionReport) {
				if r.w.cfg.OnStats != nil {
					r.w.cfg.OnStats(rep)
				}
			}})}
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		cancel()
		r.unpublish(pub)
		live.Close()
		stream.CloseProcessor(proc)
		return errRoomClosing
	}
	if old := r.convs[sid]; old != nil { // subscribed again: the new one replaces it
		defer r.finish(old)
	}
	r.convs[sid] = c
	r.wg.Add(2)
	r.mu.Unlock()
	go func() { defer r.wg.Done(); c.pipe.Feed(tr) }()
	go func() {
		defer r.wg.Done()
		defer close(c.done)
		if err := stream.Guard(log, "conversion", func() error { return c.pipe.Run(ctx, live, sampleWriter{track}) }); err != nil {
			log.Error("conversion ended", "err", err)
		}
	}()
	log.Info("converting", "track", sid)
	return nil
}

// errRoomClosing ends a conversion that was starting when the room was left.
var errRoomClosing = errors.New("room is closing")

// publish publishes an Opus track of the worker's.
func (r *Room) publish(name string) (*lksdk.LocalTrack, *lksdk.LocalTrackPublication, error) {
	track, err := lksdk.NewLocalSampleTrack(opusTrack)
	if err != nil {
		return nil, nil, err
	}
	pub, err := r.lk.LocalParticipant.PublishTrack(track, &lksdk.TrackPublicationOptions{Name: name, Source: livekit.TrackSource_MICROPHONE})
	if err != nil {
		return nil, nil, fmt.Errorf("publish track %s: %w", name, err)
	}
	return track, pub, nil
}

// stopConversion ends the conversion of a track that went away.
func (r *Room) stopConversion(sid string) {
	r.mu.Lock()
	c := r.convs[sid]
	delete(r.convs, sid)
	delete(r.waiting, sid)
	r.mu.Unlock()
	if c != nil {
		r.finish(c)
	}
}

// finish stops a conversion removed from r.convs and releases what it held.
func (r *Room) finish(c *conversion) {
	c.cancel()
	<-c.done
	procs := c.live.InUse()
	c.live.Close()
	for _, p := range procs {
		stream.CloseProcessor(p)
	}
	r.unpublish(c.pub)
	r.w.unreserve()
	js, fec, plc := c.pipe.Recovery()
	st := c.live.Stats()
	r.log.Info("conversion ended", "participant", c.identity, "audio", st.Produced.Round(time.Millisecond),
		"chunks", st.Chunks, "late_chunks", st.LateChunks, "latency", st.Latency.Round(time.Millisecond),
		"packets", js.Received, "lost", js.Lost, "fec", fec, "plc", plc)
}

func (r *Room) unpublish(pub *lksdk.LocalTrackPublication) {
	if pub != nil && r.lk.ConnectionState() == lksdk.ConnectionStateConnected {
		if err := r.lk.LocalParticipant.UnpublishTrack(pub.SID()); err != nil {
			r.log.Debug("unpublish", "err", err)
		}
	}
}

// startSpeaker publishes the TTS track and starts its speaker.
func (r *Room) startSpeaker() error {
	if r.w.cfg.Synthesizers == nil {
		return errors.New("this worker has no text-to-speech model (start it with --tts-model and --codec)")
	}
	syn, err := r.w.cfg.Synthesizers.Get(r.opts.Model)
	if err != nil {
		return err
	}
	cfg := rtc.SpeakerConfig{Synth: syn, Voice: r.opts.Voice, Owner: r.w.cfg.Owner, Log: r.log, Event: r.event}
	if adm := r.w.cfg.TTSAdmission; adm != nil {
		cfg.Admission = adm(syn.Info().Name)
	}
	sp := rtc.NewSpeaker(cfg)
	track, _, err := r.publish("voxpipe:tts")
	if err != nil {
		return err
	}
	pipe := rtc.NewPipe(rtc.PipeConfig{ID: r.name + "/tts", Encoder: r.w.cfg.Encoder, Log: r.log,
		Source: func(out []float32) bool { sp.Pull(out); return true }})
	r.mu.Lock()
	r.speaker = sp
	r.wg.Add(2)
	r.mu.Unlock()
	go func() { defer r.wg.Done(); sp.Run(r.ctx) }()
	go func() {
		defer r.wg.Done()
		if err := stream.Guard(r.log, "tts track", func() error { return pipe.Run(r.ctx, nil, sampleWriter{track}) }); err != nil {
			r.log.Error("tts track ended", "err", err)
		}
	}()
	if stream.HasWords(r.opts.Text) {
		r.Speak(rtc.Message{ContextID: "greeting", Text: r.opts.Text})
	}
	return nil
}

// Speak queues a text (tts mode).
func (r *Room) Speak(m rtc.Message) (string, error) {
	r.mu.Lock()
	sp := r.speaker
	r.mu.Unlock()
	if sp == nil {
		return stream.CodeBadMessage, errors.New("this room's worker is not in tts mode")
	}
	return sp.Speak(r.ctx, m)
}

// Cancel stops what is being spoken and drops the queued texts (barge-in).
func (r *Room) Cancel() {
	r.mu.Lock()
	sp := r.speaker
	r.mu.Unlock()
	if sp != nil {
		sp.CancelAll()
	}
}

// dataPacket takes speak and cancel messages on DataTopic (an SDK callback).
func (r *Room) dataPacket(p lksdk.DataPacket, params lksdk.DataReceiveParams) {
	u, ok := p.(*lksdk.UserDataPacket)
	if !ok || u.Topic != DataTopic {
		return
	}
	if len(u.Payload) > maxMetadata {
		r.event(rtc.Message{Type: "error", Code: stream.CodeBadMessage, Message: "message too long"})
		return
	}
	var m rtc.Message
	if err := json.Unmarshal(u.Payload, &m); err != nil {
		r.event(rtc.Message{Type: "error", Code: stream.CodeBadMessage, Message: "want a JSON message: " + err.Error()})
		return
	}
	if !r.w.limit(r.name + "/" + params.SenderIdentity) {
		r.event(rtc.Message{Type: "error", ContextID: m.ContextID, Code: rtc.CodeRateLimited, Message: "too many messages"})
		return
	}
	switch m.Type {
	case "speak":
		if code, err := r.Speak(m); err != nil {
			r.event(rtc.Message{Type: "error", ContextID: m.ContextID, Code: code, Message: err.Error()})
		}
	case "cancel":
		r.Cancel()
	default:
		r.event(rtc.Message{Type: "error", Code: stream.CodeBadMessage, Message: fmt.Sprintf("unknown message type %q: use speak or cancel", trunc(m.Type))})
	}
}

// event sends a message to the room on DataTopic.
func (r *Room) event(m rtc.Message) {
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	if err := r.lk.LocalParticipant.PublishDataPacket(&lksdk.UserDataPacket{Payload: b, Topic: DataTopic}, lksdk.WithDataPublishReliable(true)); err != nil {
		r.log.Debug("publish data", "err", err)
	}
}

// leave stops everything in the room and disconnects (once; later calls wait for it).
func (r *Room) leave(reason string) {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		<-r.done
		return
	}
	r.ended = true
	convs := r.convs
	r.convs = nil
	r.mu.Unlock()
	for _, c := range convs {
		r.finish(c)
	}
	r.cancel()
	r.lk.Disconnect() // ends the remote tracks, and so the goroutines that read them
	r.wg.Wait()
	r.w.forget(r)
	if r.onLeave != nil {
		r.onLeave()
	}
	r.log.Info("left room", "reason", reason, "duration", time.Since(r.started).Round(time.Millisecond))
	close(r.done)
}

// Info is what GET /v1/rooms shows of a room.
type Info struct {
	Name    string    `json:"name"`
	Job     string    `json:"job,omitempty"`
	Mode    string    `json:"mode"`
	Voice   string    `json:"voice,omitempty"`
	Tracks  []string  `json:"converting,omitempty"` // identities whose microphones are converted
	Started time.Time `json:"started"`
}

func (r *Room) info() Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := Info{Name: r.name, Job: r.job, Mode: r.opts.Mode, Voice: r.opts.Voice, Started: r.started}
	for _, c := range r.convs {
		in.Tracks = append(in.Tracks, c.identity)
	}
	return in
}

// Name is the room's name.
func (r *Room) Name() string { return r.name }
