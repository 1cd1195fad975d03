package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/tts"
)

// ttsLoadResult are the figures of `voxpipe bench tts-load`.
type ttsLoadResult struct {
	Sessions     int     `json:"sessions"`
	Seconds      float64 `json:"seconds"`
	Utterances   int     `json:"utterances"`
	TTFAMsP50    float64 `json:"ttfa_ms_p50"`
	TTFAMsP95    float64 `json:"ttfa_ms_p95"`
	Rejected     int     `json:"rejected"`
	Chunks       int     `json:"chunks"`
	LateChunks   int     `json:"late_chunks"`
	LatePercent  float64 `json:"late_percent"`
	AudioSeconds float64 `json:"audio_seconds"`
	// TokensPerS is every session's speech tokens over the run's wall time: the audio
	// received at a token per 40 ms (MioCodec's 25 Hz).
	TokensPerS float64 `json:"tokens_per_s"`
	// RTFP50 and RTFMax are over the utterances: the time from speak to done over the
	// audio received (admission's wait included); above 1 an utterance fell behind real time.
	RTFP50        float64 `json:"rtf_p50"`
	RTFMax        float64 `json:"rtf_max"`
	CPUPercent    float64 `json:"cpu_percent"`
	ServerStarted bool    `json:"server_started"`
}

func runBenchTTSLoad(args []string, stdout, stderr io.Writer) error {
	gd := golden.Root()
	fs := newFlags("bench tts-load", "bench tts-load --sessions N --seconds S [--server URL | --model LM --codec CODEC --voice REF.wav] [--json]", stderr)
	sessions := fs.Int("sessions", 4, "concurrent TTS WebSocket sessions")
	seconds := fs.Float64("seconds", 10, "how long each session keeps speaking")
	server := fs.String("server", "", "a running server's base URL (default: start one with the models below)")
	model := fs.String("model", filepath.Join(gd, "miotts", "model.gguf"), "MioTTS model for the started server")
	codec := fs.String("codec", filepath.Join(gd, "miocodec", "model.gguf"), "MioCodec model for the started server")
	voice := fs.String("voice", filepath.Join("testdata", "speech_en_48k.wav"), "reference clip for the started server")
	slots := fs.Int("slots", 8, "--tts-slots of the started server (the cap; the model's measured capacity admits fewer)")
	queue := fs.Duration("queue", 2*time.Second, "--tts-queue of the started server")
	place := serverPlacementFlags(fs, "codec-backend", "where the started server runs MioCodec")
	text := fs.String("text", "Thank you for calling. Your order has shipped and will arrive on Tuesday.", "text each utterance speaks")
	maxTokens := fs.Int("max-tokens", 75, "speech tokens per utterance at most (3 s)")
	slack := fs.Duration("slack", 200*time.Millisecond, "a chunk is late when it arrives this long after its playout time")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	res := ttsLoadResult{Sessions: *sessions, Seconds: *seconds}
	base, pid := *server, 0
	if base == "" {
		for _, p := range []string{*model, *codec, *voice} {
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("%v: give --model, --codec and --voice (or --server)", err)
			}
		}
		var stop func()
		var err error
		args := append([]string{"--tts-model", *model, "--codec", *codec, "--tts-voice", *voice,
			"--tts-slots", fmt.Sprint(*slots), "--tts-queue", queue.String(), "--voices", filepath.Join(os.TempDir(), "voxpipe-bench-voices")},
			place.args()...)
		base, pid, stop, err = startServer(stderr, args...)
		if err != nil {
			return err
		}
		defer stop()
		res.ServerStarted = true
	}
	wsURL := "ws" + strings.TrimPrefix(base, "http") + "/v1/tts/ws"
	cpu0, _ := cpuTime(pid)
	start := time.Now()
	deadline := start.Add(time.Duration(*seconds * float64(time.Second)))
	var mu sync.Mutex
	var ttfas, rtfs []float64
	var wg sync.WaitGroup
	errc := make(chan error, *sessions)
	for i := range *sessions {
		wg.Go(func() {
			st, err := loadSession(wsURL, i, *text, *maxTokens, deadline, *slack)
			mu.Lock()
			defer mu.Unlock()
			ttfas = append(ttfas, st.ttfas...)
			rtfs = append(rtfs, st.rtfs...)
			res.Utterances += len(st.ttfas)
			res.Rejected += st.rejected
			res.Chunks += st.chunks
			res.LateChunks += st.late
			res.AudioSeconds += st.audio
			if err != nil {
				errc <- err
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	if cpu1, err := cpuTime(pid); err == nil && pid != 0 {
		res.CPUPercent = 100 * (cpu1 - cpu0).Seconds() / wall.Seconds()
	}
	res.TTFAMsP50, res.TTFAMsP95 = percentile(ttfas, 50), percentile(ttfas, 95)
	res.TokensPerS = res.AudioSeconds / speechTokenPeriod.Seconds() / wall.Seconds()
	res.RTFP50, res.RTFMax = percentile(rtfs, 50), percentile(rtfs, 100)
	if res.Chunks > 0 {
		res.LatePercent = 100 * float64(res.LateChunks) / float64(res.Chunks)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%d TTS sessions for %.0f s: %d utterances, %.1f s of audio\n", res.Sessions, res.Seconds, res.Utterances, res.AudioSeconds)
	fmt.Fprintf(stdout, "  %.1f speech tokens/s together; per utterance (speak to done ÷ its audio) RTF p50 %.2f, max %.2f\n",
		res.TokensPerS, res.RTFP50, res.RTFMax)
	fmt.Fprintf(stdout, "  time to first audio p50 %.0f ms, p95 %.0f ms\n", res.TTFAMsP50, res.TTFAMsP95)
	fmt.Fprintf(stdout, "  rejected (busy) %d; late chunks %d of %d (%.2f %%); server CPU %.0f %%\n",
		res.Rejected, res.LateChunks, res.Chunks, res.LatePercent, res.CPUPercent)
	return nil
}

// speechTokenPeriod is the audio of one MioTTS speech token (MioCodec's 25 Hz).
const speechTokenPeriod = 40 * time.Millisecond

type loadStats struct {
	ttfas, rtfs  []float64
	rejected     int
	chunks, late int
	audio        float64 // seconds
}

// loadSession speaks utterances one after another on one socket until the deadline. A
// chunk is late when it arrives after the moment a player that started at the first audio
// would need it (plus slack): the stream fell behind real time.
func loadSession(url string, n int, text string, maxTokens int, deadline time.Time, slack time.Duration) (loadStats, error) {
	var st loadStats
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		return st, fmt.Errorf("session %d: %w", n, err)
	}
	defer conn.Close()
	const rate = 24000 // pcm_s16le default
	for u := 0; time.Now().Before(deadline); u++ {
		id := fmt.Sprintf("s%d-u%d", n, u)
		sent := time.Now()
		if err := conn.WriteJSON(map[string]any{"type": "speak", "context_id": id, "text": text,
			"options": map[string]any{"max_tokens": maxTokens, "seed": n*1000 + u + 1}}); err != nil {
			return st, err
		}
		var first time.Time
		var samples int
		for {
			var m tts.ServerMessage
			if err := conn.ReadJSON(&m); err != nil {
				return st, fmt.Errorf("session %d: %w", n, err)
			}
			if m.ContextID != id {
				continue
			}
			switch m.Type {
			case "audio":
				now := time.Now()
				if first.IsZero() {
					first = now
					st.ttfas = append(st.ttfas, ms(now.Sub(sent)))
				}
				due := first.Add(time.Duration(samples) * time.Second / rate)
				if now.After(due.Add(slack)) {
					st.late++
				}
				st.chunks++
				samples += len(m.Data) / 2
			case "error":
				if m.Code != tts.CodeBusy {
					return st, fmt.Errorf("session %d: %s: %s", n, m.Code, m.Message)
				}
				st.rejected++
				time.Sleep(time.Duration(max(200, min(m.RetryAfterMs, 1000))) * time.Millisecond)
			case "done":
				if samples > 0 {
					st.rtfs = append(st.rtfs, time.Since(sent).Seconds()*rate/float64(samples))
				}
			}
			if m.Type != "audio" {
				break
			}
		}
		st.audio += float64(samples) / rate
	}
	return st, nil
}
