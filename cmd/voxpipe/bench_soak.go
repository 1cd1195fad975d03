package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
	"github.com/voxpipe/voxpipe/tts"
)

// Flatness limits of the soak: the idle server after the run against the idle server after
// the warm-up. Goroutines and fds are counts that must come back (a small slack for the
// runtime's and Pion's timers winding down); RSS and heap may drift a little.
const (
	soakGoroutineSlack = 3
	soakFDSlack        = 2
	soakGrowth         = 1.10
)

// soakOptions are the settings of `voxpipe bench soak`.
type soakOptions struct {
	duration            time.Duration
	sessions, streams   int
	seed                uint64
	model, codec, voice string
	slack               time.Duration // a TTS chunk this late after its playout time is late
	place               *serverPlacement
	log                 io.Writer
}

// resources are the server's own figures: RSS, goroutines and open fds from its /metrics
// (Go and process collectors); the Go heap (bytes of allocated objects) from /metrics under
// load (Peak), and from the heap profile's MemStats after a forced collection when idle.
type resources struct {
	RSSBytes   float64 `json:"rss_bytes"`
	HeapBytes  float64 `json:"heap_alloc_bytes"`
	Goroutines float64 `json:"goroutines"`
	FDs        float64 `json:"open_fds"`
}

// soakResult are the figures of one soak run.
type soakResult struct {
	Bench    string  `json:"bench"`
	Seconds  float64 `json:"seconds"`
	Sessions int     `json:"sessions"`
	Streams  int     `json:"streams"`
	Seed     uint64  `json:"seed"`
	// Start: idle after the warm-up round; End: idle after the run; Peak: the most seen
	// while clients were connected (warm-up included).
	Start     resources `json:"start"`
	End       resources `json:"end"`
	Peak      resources `json:"peak"`
	RSSRatio  float64   `json:"rss_ratio"`
	HeapRatio float64   `json:"heap_ratio"`

	RTCSessions int `json:"rtc_sessions"`
	RTCAborted  int `json:"rtc_aborted"`
	RTCChunks   int `json:"rtc_chunks"`
	RTCLate     int `json:"rtc_late_chunks"`
	TTSStreams  int `json:"tts_streams"`
	TTSCanceled int `json:"tts_canceled"`
	TTSDropped  int `json:"tts_dropped"` // TCP closed without a close frame mid-utterance
	TTSChunks   int `json:"tts_chunks"`
	TTSLate     int `json:"tts_late_chunks"`
	// Expected outcomes of races that are not faults (a cancel that arrives after done).
	Expected map[string]int `json:"expected"`
	// Errors are unexpected, by kind; ErrorSamples the first few messages.
	Errors       map[string]int `json:"errors"`
	ErrorSamples []string       `json:"error_samples,omitempty"`
	Problems     []string       `json:"problems"`
	Flat         bool           `json:"flat"`
}

func runBenchSoak(args []string, stdout, stderr io.Writer) error {
	gd := golden.Root()
	fs := newFlags("bench soak", "bench soak [--minutes M] [--sessions N] [--streams M] [--seed S] [--json]", stderr)
	minutes := fs.Float64("minutes", 10, "how long clients keep joining and leaving")
	o := soakOptions{log: stderr}
	fs.IntVar(&o.sessions, "sessions", 6, "WebRTC dsp sessions at once")
	fs.IntVar(&o.streams, "streams", 3, "TTS WebSocket streams at once")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the clients' random choices (lengths, texts, how they leave)")
	fs.StringVar(&o.model, "model", filepath.Join(gd, "miotts", "model.gguf"), "MioTTS model for the server")
	fs.StringVar(&o.codec, "codec", filepath.Join(gd, "miocodec", "model.gguf"), "MioCodec model for the server")
	fs.StringVar(&o.voice, "voice", filepath.Join("testdata", "speech_en_48k.wav"), "the server's TTS reference clip")
	fs.DurationVar(&o.slack, "slack", 200*time.Millisecond, "a TTS chunk is late when it arrives this long after its playout time")
	o.place = serverPlacementFlags(fs, "codec-backend", "where the started server runs MioCodec")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *minutes <= 0 || o.sessions < 0 || o.streams < 0 || o.sessions+o.streams == 0 {
		return errors.New("--minutes must be > 0, and --sessions or --streams ≥ 1")
	}
	o.duration = time.Duration(*minutes * float64(time.Minute))
	res, err := benchSoak(o)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return err
		}
	} else {
		printSoak(stdout, res)
	}
	if !res.Flat {
		return fmt.Errorf("soak failed: %s", strings.Join(res.Problems, "; "))
	}
	return nil
}

func printSoak(w io.Writer, r *soakResult) {
	fmt.Fprintf(w, "soak: %d WebRTC sessions + %d TTS streams at once for %.0f s (seed %d)\n", r.Sessions, r.Streams, r.Seconds, r.Seed)
	fmt.Fprintf(w, "  WebRTC: %d sessions (%d dropped without goodbye), late chunks %d of %d\n", r.RTCSessions, r.RTCAborted, r.RTCLate, r.RTCChunks)
	fmt.Fprintf(w, "  TTS: %d streams (%d canceled, %d cut mid-utterance), late chunks %d of %d\n", r.TTSStreams, r.TTSCanceled, r.TTSDropped, r.TTSLate, r.TTSChunks)
	fmt.Fprintf(w, "  server        %12s %12s %7s %12s\n", "start", "end", "ratio", "peak")
	mb := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	fmt.Fprintf(w, "  RSS           %12s %12s %7.3f %12s\n", mb(r.Start.RSSBytes), mb(r.End.RSSBytes), r.RSSRatio, mb(r.Peak.RSSBytes))
	fmt.Fprintf(w, "  Go heap       %12s %12s %7.3f %12s\n", mb(r.Start.HeapBytes), mb(r.End.HeapBytes), r.HeapRatio, mb(r.Peak.HeapBytes))
	fmt.Fprintf(w, "  goroutines    %12.0f %12.0f %+7.0f %12.0f\n", r.Start.Goroutines, r.End.Goroutines, r.End.Goroutines-r.Start.Goroutines, r.Peak.Goroutines)
	fmt.Fprintf(w, "  open fds      %12.0f %12.0f %+7.0f %12.0f\n", r.Start.FDs, r.End.FDs, r.End.FDs-r.Start.FDs, r.Peak.FDs)
	fmt.Fprintf(w, "  expected races %v; unexpected errors %v\n", r.Expected, r.Errors)
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(w, "    %s\n", s)
	}
	if r.Flat {
		fmt.Fprintln(w, "  flat: yes (goroutines, fds back to the start; RSS and heap within 10 %)")
	} else {
		fmt.Fprintf(w, "  flat: NO: %s\n", strings.Join(r.Problems, "; "))
	}
}

// benchSoak starts a server with TTS as a child process, so its figures are its own, runs a
// warm-up round of every client kind, samples the idle server, lets clients join and leave
// at random for o.duration, and samples the idle server again.
func benchSoak(o soakOptions) (*soakResult, error) {
	for _, p := range []string{o.model, o.codec, o.voice} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%v: give --model, --codec and --voice", err)
		}
	}
	voices, err := os.MkdirTemp("", "voxpipe-soak-voices")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(voices)
	dbgAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	logs := &errorLines{w: o.log}
	o.log = logs
	// One slot more than streams: a slot freed by a dropped client is never needed at once.
	args := []string{"--tts-model", o.model, "--codec", o.codec, "--tts-voice", o.voice,
		"--tts-slots", strconv.Itoa(o.streams + 1), "--sessions-per-key", "0", "--voices", voices, "--debug-listen", dbgAddr}
	if o.place != nil {
		args = append(args, o.place.args()...)
	}
	base, _, stop, err := startServer(logs, args...)
	if err != nil {
		return nil, err
	}
	defer stop()
	s := &soak{o: o, base: base, dbg: "http://" + dbgAddr,
		res: &soakResult{Bench: "soak", Seconds: o.duration.Seconds(), Sessions: o.sessions, Streams: o.streams, Seed: o.seed,
			Expected: map[string]int{}, Errors: map[string]int{}}}
	pcm, _ := rtcclient.ClickTrain(11, 500*time.Millisecond) // longer than any session
	if s.packets, err = rtcclient.EncodeFrames(pcm); err != nil {
		return nil, err
	}
	stopCh, peakDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(peakDone); s.watchPeak(stopCh) }()
	stopPeak := sync.OnceFunc(func() { close(stopCh); <-peakDone })
	defer stopPeak()

	// Warm-up: one round of every client kind at full concurrency, so first-use growth
	// (pools, arenas, code paths) happens before the start sample.
	s.clients(true, time.Time{})
	start, gStart, err := s.quiet(nil)
	if err != nil {
		return nil, err
	}
	s.clients(false, time.Now().Add(o.duration))
	stopPeak()
	end, gEnd, err := s.quiet(&start)
	if err != nil {
		return nil, err
	}
	r := s.res
	r.Start, r.End = start, end
	r.RSSRatio, r.HeapRatio = ratio(end.RSSBytes, start.RSSBytes), ratio(end.HeapBytes, start.HeapBytes)
	if n := logs.count(); n > 0 {
		r.Errors["server_log_error"] += n
	}
	r.Problems = soakVerdict(start, end)
	if end.Goroutines-start.Goroutines > soakGoroutineSlack {
		for _, g := range goroutineGrowth(gStart, gEnd, 5) {
			fmt.Fprintf(o.log, "soak: goroutines that grew:\n%s\n", g)
		}
	}
	for k, n := range r.Errors {
		r.Problems = append(r.Problems, fmt.Sprintf("%d unexpected %s", n, k))
	}
	slices.Sort(r.Problems)
	r.Flat = len(r.Problems) == 0
	return r, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// soakVerdict lists what did not come back between two idle samples.
func soakVerdict(start, end resources) []string {
	var p []string
	if d := end.Goroutines - start.Goroutines; d > soakGoroutineSlack {
		p = append(p, fmt.Sprintf("goroutines %.0f → %.0f (+%.0f, slack %d)", start.Goroutines, end.Goroutines, d, soakGoroutineSlack))
	}
	if d := end.FDs - start.FDs; d > soakFDSlack {
		p = append(p, fmt.Sprintf("open fds %.0f → %.0f (+%.0f, slack %d)", start.FDs, end.FDs, d, soakFDSlack))
	}
	if end.RSSBytes > start.RSSBytes*soakGrowth {
		p = append(p, fmt.Sprintf("RSS %.1f → %.1f MiB (×%.3f)", start.RSSBytes/(1<<20), end.RSSBytes/(1<<20), end.RSSBytes/start.RSSBytes))
	}
	if end.HeapBytes > start.HeapBytes*soakGrowth {
		p = append(p, fmt.Sprintf("Go heap %.1f → %.1f MiB (×%.3f)", start.HeapBytes/(1<<20), end.HeapBytes/(1<<20), end.HeapBytes/start.HeapBytes))
	}
	return p
}

// soak is one run: the server's addresses, the shared encoded audio and the tallies.
type soak struct {
	o       soakOptions
	base    string // the server
	dbg     string // its --debug-listen (pprof: a forced GC, goroutine stacks)
	packets [][]byte
	nextID  atomic.Int64

	mu  sync.Mutex
	res *soakResult
}

// soakHTTP opens a connection per request, so none stays open in the server between samples.
var soakHTTP = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}

func (s *soak) fail(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.res.Errors[kind]++
	if len(s.res.ErrorSamples) < 8 {
		s.res.ErrorSamples = append(s.res.ErrorSamples, kind+": "+err.Error())
	}
}

func (s *soak) tally(f func(r *soakResult)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.res)
}

// clients runs o.sessions WebRTC and o.streams TTS clients, each a loop of join, use, leave
// until the deadline; warm-up runs one round of every kind instead.
func (s *soak) clients(warmup bool, deadline time.Time) {
	var wg sync.WaitGroup
	for i := range s.o.sessions {
		rng := rand.New(rand.NewPCG(s.o.seed, uint64(i)))
		wg.Go(func() {
			if warmup {
				s.rtcSession(rng, 2*time.Second, i%2 == 1)
				return
			}
			for soakPause(rng); time.Until(deadline) > 2*time.Second; soakPause(rng) {
				d := min(time.Until(deadline), 2*time.Second+randDur(rng, 8*time.Second))
				s.rtcSession(rng, d, rng.IntN(4) == 0)
			}
		})
	}
	for i := range s.o.streams {
		rng := rand.New(rand.NewPCG(s.o.seed, uint64(1000+i)))
		wg.Go(func() {
			if warmup {
				for kind := range 4 {
					s.ttsClient(rng, kind, soakMinTokens, 2*time.Second)
				}
				// The codec compiles a program per window shape, and an utterance's last
				// windows take their shape from its length: speak every length the run
				// will draw, so that cache is as full at the start as it gets.
				for tokens := soakMinTokens + i; tokens < soakMaxTokens; tokens += s.o.streams {
					s.ttsClient(rng, 1, tokens, 0)
				}
				return
			}
			for soakPause(rng); time.Until(deadline) > 2*time.Second; soakPause(rng) {
				tokens := soakMinTokens + rng.IntN(soakMaxTokens-soakMinTokens)
				s.ttsClient(rng, rng.IntN(4), tokens, min(time.Until(deadline), 2*time.Second+randDur(rng, 8*time.Second)))
			}
		})
	}
	wg.Wait()
}

// soakPause is the gap before a client joins again.
func soakPause(rng *rand.Rand) { time.Sleep(randDur(rng, 500*time.Millisecond)) }

func randDur(rng *rand.Rand, d time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(d)))
}

// rtcSession is one live dsp session that sends a click train for d, then leaves with a
// goodbye or, when abort, drops its socket and peer like a crashed tab.
func (s *soak) rtcSession(rng *rand.Rand, d time.Duration, abort bool) {
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	c, err := rtcclient.Dial(ctx, rtcclient.Options{URL: rtcclient.WSURL(s.base), Voice: "dsp",
		Params: map[string]float64{"pitch_semitones": float64(rng.IntN(13) - 6)}, Seed: rng.Uint64()})
	if err != nil {
		s.fail("rtc_dial", err)
		return
	}
	sctx, scancel := context.WithTimeout(ctx, d)
	err = c.SendPackets(sctx, s.packets)
	scancel()
	if abort {
		c.Abort()
	} else {
		c.Close()
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		s.fail("rtc_send", err)
	}
	for _, m := range c.Messages() {
		if m.Type == "error" {
			s.fail("rtc_error_"+m.Code, errors.New(m.Message))
		}
	}
	got := len(c.Received().Packets)
	st := c.Stats()
	s.tally(func(r *soakResult) {
		r.RTCSessions++
		if abort {
			r.RTCAborted++
		}
		if len(st) > 0 {
			r.RTCChunks += st[len(st)-1].Chunks
			r.RTCLate += st[len(st)-1].LateChunks
		}
	})
	if got == 0 {
		s.fail("rtc_no_audio", fmt.Errorf("no audio back in %v", d))
	}
}

var soakTexts = []string{
	"Thank you for calling.",
	"Your order has shipped and will arrive on Tuesday.",
	"Please hold while I transfer you to the next available agent.",
	"The quick brown fox jumps over the lazy dog.",
	"Press one for billing, two for support.",
	"It is sunny in the morning and raining by noon, so take an umbrella.",
}

var soakFormats = []string{"pcm_s16le", "mulaw", "opus", "wav"}

// Speech tokens per utterance that the TTS clients ask for (1 to 3 s of audio).
const soakMinTokens, soakMaxTokens = 25, 75

// How a TTS client ends its utterance.
const (
	ttsComplete = iota // reads until done
	ttsCancel          // cancels once audio flows, then waits for done
	ttsDrop            // closes its TCP connection once audio flows, without a close frame
)

// ttsClient is one TTS WebSocket client of a kind: 0 speaks utterances of at most tokens
// for d (the tts-load session, which counts late chunks); 1, 2 and 3 speak one utterance in
// a random format and end it as ttsComplete, ttsCancel or ttsDrop.
func (s *soak) ttsClient(rng *rand.Rand, kind, tokens int, d time.Duration) {
	url := "ws" + strings.TrimPrefix(s.base, "http") + "/v1/tts/ws"
	text := soakTexts[rng.IntN(len(soakTexts))]
	n := int(s.nextID.Add(1))
	if kind == 0 {
		st, err := loadSession(url, n, text, tokens, time.Now().Add(d), s.o.slack)
		if err != nil {
			s.fail("tts_session", err)
		}
		s.tally(func(r *soakResult) {
			r.TTSStreams++
			r.TTSChunks += st.chunks
			r.TTSLate += st.late
			if st.rejected > 0 {
				r.Errors["tts_busy"] += st.rejected // there is a slot per client and one spare
			}
		})
		return
	}
	end := kind - 1
	if end != ttsComplete {
		text, tokens = text+" "+text, 150 // long enough to be cut
	}
	if err := s.ttsUtterance(url, n, rng, text, tokens, end); err != nil {
		s.fail("tts_utterance", err)
	}
}

// ttsUtterance speaks one utterance in a random format on its own socket and ends it as end
// says (ttsComplete, ttsCancel, ttsDrop).
func (s *soak) ttsUtterance(url string, n int, rng *rand.Rand, text string, tokens, end int) error {
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	id := fmt.Sprintf("u%d", n)
	format := soakFormats[rng.IntN(len(soakFormats))]
	if err := conn.WriteJSON(map[string]any{"type": "speak", "context_id": id, "text": text,
		"format": map[string]any{"encoding": format}, "options": map[string]any{"max_tokens": tokens, "seed": n}}); err != nil {
		return err
	}
	after := randDur(rng, 300*time.Millisecond) // how long audio flows before the interruption
	var first time.Time
	chunks := 0
	for end == ttsComplete || first.IsZero() || time.Since(first) < after {
		var m tts.ServerMessage
		if err := conn.ReadJSON(&m); err != nil {
			return fmt.Errorf("%s: %w", format, err)
		}
		switch m.Type {
		case "audio":
			chunks++
			if first.IsZero() {
				first = time.Now()
			}
		case "error":
			return fmt.Errorf("%s: %s: %s", format, m.Code, m.Message)
		case "done":
			s.tally(func(r *soakResult) {
				if end != ttsComplete {
					r.Expected["tts_done_before_interruption"]++
				}
				r.TTSStreams++
				r.TTSChunks += chunks
			})
			return nil
		}
	}
	if end == ttsDrop {
		conn.UnderlyingConn().Close() // a client that vanished
		s.tally(func(r *soakResult) { r.TTSStreams++; r.TTSDropped++; r.TTSChunks += chunks })
		return nil
	}
	if err := conn.WriteJSON(map[string]any{"type": "cancel", "context_id": id}); err != nil {
		return err
	}
	for {
		var m tts.ServerMessage
		if err := conn.ReadJSON(&m); err != nil {
			return fmt.Errorf("%s after cancel: %w", format, err)
		}
		switch {
		case m.Type == "audio":
			chunks++
		case m.Type == "done" && m.Canceled:
			s.tally(func(r *soakResult) { r.TTSStreams++; r.TTSCanceled++; r.TTSChunks += chunks })
			conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return nil
		case m.Type == "done":
			// It finished before the cancel arrived; the cancel then names a closed context.
			s.tally(func(r *soakResult) { r.Expected["tts_cancel_after_done"]++; r.TTSStreams++; r.TTSChunks += chunks })
			return nil
		case m.Type == "error":
			return fmt.Errorf("%s after cancel: %s: %s", format, m.Code, m.Message)
		}
	}
}

// quiet waits until the server has no sessions, forces a collection before each sample and
// takes 9 samples 250 ms apart: the least goroutines and fds (a scrape briefly adds its own),
// the median RSS and heap. Given the start figures, it keeps sampling (up to 20 s) while
// they are above them: closed peers' timers and the scavenger's return of memory take a
// moment. It also returns the goroutine profile.
func (s *soak) quiet(start *resources) (resources, string, error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var h struct {
			Sessions int `json:"sessions"`
			TTS      int `json:"tts_streams"`
		}
		if err := getJSON(s.base+"/healthz", &h); err != nil {
			return resources{}, "", err
		}
		if h.Sessions == 0 && h.TTS == 0 {
			break
		}
		if time.Now().After(deadline) {
			return resources{}, "", fmt.Errorf("server still has %d sessions and %d TTS streams 20 s after every client left", h.Sessions, h.TTS)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The Go heap comes from the heap profile's MemStats, read right after the collection
	// the request forces: exact, where /metrics' figure counts the spans each P has cached
	// since the collection as allocated (about a megabyte of noise on a small heap).
	sample := func() (resources, error) {
		p, err := httpGet(s.dbg + "/debug/pprof/heap?gc=1&debug=1")
		if err != nil {
			return resources{}, err
		}
		r, err := scrapeResources(s.base)
		if err != nil {
			return resources{}, err
		}
		_, after, ok := strings.Cut(string(p), "\n# HeapAlloc = ")
		n, _, _ := strings.Cut(after, "\n")
		if r.HeapBytes, err = strconv.ParseFloat(n, 64); !ok || err != nil {
			return resources{}, errors.New("the heap profile has no HeapAlloc")
		}
		return r, nil
	}
	// The first profile request allocates what later ones reuse: not part of a sample.
	if _, err := sample(); err != nil {
		return resources{}, "", err
	}
	var rss, heap []float64
	var q resources
	for i := 0; ; i++ {
		r, err := sample()
		if err != nil {
			return resources{}, "", err
		}
		rss, heap = append(rss, r.RSSBytes), append(heap, r.HeapBytes)
		if i == 0 {
			q.Goroutines, q.FDs = r.Goroutines, r.FDs
		}
		q.Goroutines, q.FDs = min(q.Goroutines, r.Goroutines), min(q.FDs, r.FDs)
		if i >= 8 {
			q.RSSBytes, q.HeapBytes = median(rss[i-8:]), median(heap[i-8:])
			if start == nil || len(soakVerdict(*start, q)) == 0 || time.Now().After(deadline) {
				break
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	g, err := httpGet(s.dbg + "/debug/pprof/goroutine?debug=1")
	return q, string(g), err
}

// watchPeak samples the server every second until stop closes.
func (s *soak) watchPeak(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if r, err := scrapeResources(s.base); err == nil {
			s.tally(func(res *soakResult) {
				p := &res.Peak
				*p = resources{max(p.RSSBytes, r.RSSBytes), max(p.HeapBytes, r.HeapBytes), max(p.Goroutines, r.Goroutines), max(p.FDs, r.FDs)}
			})
		}
	}
}

func httpGet(url string) ([]byte, error) {
	resp, err := soakHTTP.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

func getJSON(url string, v any) error {
	b, err := httpGet(url)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// scrapeResources reads the server's RSS, Go heap (allocated), goroutines and open fds from the
// Prometheus text at base/metrics.
func scrapeResources(base string) (resources, error) {
	b, err := httpGet(base + "/metrics")
	if err != nil {
		return resources{}, err
	}
	var r resources
	fields := map[string]*float64{"process_resident_memory_bytes": &r.RSSBytes, "go_memstats_heap_alloc_bytes": &r.HeapBytes,
		"go_goroutines": &r.Goroutines, "process_open_fds": &r.FDs}
	found := 0
	for line := range strings.Lines(string(b)) {
		name, val, _ := strings.Cut(strings.TrimSpace(line), " ")
		if p := fields[name]; p != nil {
			if *p, err = strconv.ParseFloat(val, 64); err != nil {
				return resources{}, fmt.Errorf("metrics: %s: %w", name, err)
			}
			found++
		}
	}
	if found != len(fields) {
		return resources{}, fmt.Errorf("metrics at %s lack the Go or process collector's figures", base)
	}
	return r, nil
}

// goroutineGrowth compares two goroutine profiles (pprof debug=1: "N @ addrs" then the
// stack) and returns the stacks that grew most, each with its counts.
func goroutineGrowth(before, after string, most int) []string {
	parse := func(p string) map[string]int {
		m := map[string]int{}
		if strings.HasPrefix(p, "goroutine profile:") {
			_, p, _ = strings.Cut(p, "\n")
		}
		for block := range strings.SplitSeq(p, "\n\n") {
			head, stack, ok := strings.Cut(block, "\n")
			n, _, _ := strings.Cut(head, " @")
			if c, err := strconv.Atoi(n); ok && err == nil {
				m[stack] += c
			}
		}
		return m
	}
	b, a := parse(before), parse(after)
	type grown struct {
		stack string
		d     int
	}
	var g []grown
	for st, n := range a {
		if d := n - b[st]; d > 0 {
			g = append(g, grown{st, d})
		}
	}
	slices.SortFunc(g, func(x, y grown) int { return y.d - x.d })
	var out []string
	for _, x := range g[:min(most, len(g))] {
		out = append(out, fmt.Sprintf("+%d (%d → %d)\n%s", x.d, b[x.stack], a[x.stack], x.stack))
	}
	return out
}

// errorLines passes the server's log through and counts its ERROR records; it serialises
// writes, so the soak's own notes can share it.
type errorLines struct {
	w    io.Writer
	mu   sync.Mutex
	part []byte // an unfinished line
	n    int
}

func (e *errorLines) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.part = append(e.part, p...)
	for {
		i := bytes.IndexByte(e.part, '\n')
		if i < 0 {
			break
		}
		if bytes.Contains(e.part[:i], []byte("level=ERROR")) {
			e.n++
		}
		e.part = e.part[i+1:]
	}
	return e.w.Write(p)
}

func (e *errorLines) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

// freeLoopbackAddr is a loopback TCP address free at the moment.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
