package rtc_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/voxpipe/voxpipe/dsp"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startServer runs a real rtc.Server behind an HTTP test server.
func startServer(t *testing.T) (*rtc.Server, string) {
	return startServerWith(t, rtc.Config{})
}

// startServerWith runs a server of cfg (with loopback candidates) until the test ends, and
// returns it with its signaling URL.
func startServerWith(t *testing.T, cfg rtc.Config) (*rtc.Server, string) {
	t.Helper()
	cfg.Loopback = true
	srv, err := rtc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
	})
	return srv, rtcclient.WSURL(hs.URL)
}

// speech loads the committed espeak-ng fixture (48 kHz mono).
func speech(t *testing.T) []float32 {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	a, err := wav.ReadFile(filepath.Join(filepath.Dir(file), "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	if a.SampleRate != 48000 {
		t.Fatalf("fixture rate %d, want 48000", a.SampleRate)
	}
	return a.Mono()
}

// roundTrip sends pcm through a fresh session and returns what came back.
func roundTrip(t *testing.T, url string, opts rtcclient.Options, pcm []float32) (*rtcclient.Client, rtcclient.Received) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts.URL = url
	c, err := rtcclient.Dial(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	packets, err := rtcclient.EncodeFrames(pcm)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendPackets(ctx, packets); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // let the tail and a stats message come back
	return c, c.Received()
}

func rms(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v * v)
	}
	return math.Sqrt(s / float64(max(len(x), 1)))
}

// align finds the lag (in samples) of got relative to ref with the highest correlation,
// searching lo…hi, and returns it with the normalised correlation at that lag.
func align(ref, got []float32, lo, hi int) (int, float64) {
	best, bestC := 0, -1.0
	for lag := max(lo, 0); lag <= hi && lag < len(got); lag++ {
		xy, xx, yy := dots(ref, got[lag:])
		if c := xy / math.Sqrt(xx*yy+1e-20); c > bestC {
			best, bestC = lag, c
		}
	}
	return best, bestC
}

func dots(a, b []float32) (ab, aa, bb float64) {
	for i := range min(len(a), len(b)) {
		x, y := float64(a[i]), float64(b[i])
		ab += x * y
		aa += x * x
		bb += y * y
	}
	return
}

// alignedCorrelation aligns got to ref window by window (the jitter buffer may shed or
// conceal a frame mid-call, which moves the rest of the stream by 20 ms) and returns the
// correlation over all windows with speech, and the median lag in samples.
func alignedCorrelation(ref, got []float32) (float64, int) {
	const win = 48000 / 4
	coarse, _ := align(ref[:min(len(ref), 48000)], got, 0, 48000/2)
	var xy, xx, yy float64
	var lags []int
	for i := 0; i+win <= len(ref); i += win {
		w := ref[i : i+win]
		if rms(w) < 0.02 {
			continue
		}
		lag, _ := align(w, got, i+coarse-48000*60/1000, i+coarse+48000*60/1000)
		if lag+win > len(got) {
			break
		}
		a, b, c := dots(w, got[lag:lag+win])
		xy, xx, yy = xy+a, xx+b, yy+c
		lags = append(lags, lag-i)
	}
	if len(lags) == 0 {
		return 0, 0
	}
	slices.Sort(lags)
	return xy / math.Sqrt(xx*yy+1e-20), lags[len(lags)/2]
}

// pitchShift measures how many semitones out is above in: it aligns the two by their energy
// envelopes, estimates F0 every 10 ms in both, and takes the median ratio over the frames
// voiced in both.
func pitchShift(in, out []float32) (float64, int) {
	const hop = 480 // 10 ms
	env := func(x []float32) []float32 {
		e := make([]float32, len(x)/hop)
		for i := range e {
			e[i] = float32(rms(x[i*hop : (i+1)*hop]))
		}
		return e
	}
	lagFrames, _ := align(env(in), env(out), 0, 100) // up to 1 s of offset
	fi := dsp.EstimateF0(in, 48000, 0.01)
	fo := dsp.EstimateF0(out, 48000, 0.01)
	var shifts []float64
	for i, f := range fi {
		if j := i + lagFrames; f > 0 && j < len(fo) && fo[j] > 0 {
			shifts = append(shifts, 12*math.Log2(fo[j]/f))
		}
	}
	if len(shifts) == 0 {
		return 0, 0
	}
	slices.Sort(shifts)
	return shifts[len(shifts)/2], len(shifts)
}

func TestLoopbackPitchShift(t *testing.T) {
	_, url := startServer(t)
	in := speech(t)
	c, got := roundTrip(t, url, rtcclient.Options{Voice: "dsp", Params: map[string]float64{"pitch_semitones": 4}}, in)

	sentDur := float64(len(in)) / 48000
	gotDur := float64(len(got.PCM)) / 48000
	// The server sends on its own clock from the first packet on; the tail wait adds ≤ 1.2 s.
	if gotDur < sentDur || gotDur > sentDur+2 {
		t.Errorf("received %.2f s of audio for %.2f s sent", gotDur, sentDur)
	}
	if r := rms(got.PCM); r < 0.3*rms(in) {
		t.Errorf("output RMS %.4f is far below input RMS %.4f: mostly silence", r, rms(in))
	}
	shift, frames := pitchShift(in, got.PCM)
	t.Logf("median F0 %.1f Hz → %.1f Hz; frame by frame %+.2f semitones over %d voiced frames",
		dsp.MedianF0(in, 48000), dsp.MedianF0(got.PCM, 48000), shift, frames)
	if frames < 50 {
		t.Fatalf("only %d voiced frames in both input and output", frames)
	}
	if math.Abs(shift-4) > 0.3 {
		t.Errorf("pitch shift %+.2f semitones, want +4 ± 0.3", shift)
	}
	st := c.Stats()
	if len(st) == 0 {
		t.Fatal("no stats message in the whole call")
	}
	last := st[len(st)-1]
	t.Logf("stats: %+v", last)
	if last.Voice != "dsp" || last.Packets.Received == 0 || last.Latency.Server <= 0 || last.Latency.Algorithmic <= 0 {
		t.Errorf("stats do not describe the call: %+v", last)
	}
}

func TestLoopbackIdentityCorrelates(t *testing.T) {
	_, url := startServer(t)
	in := speech(t)
	_, got := roundTrip(t, url, rtcclient.Options{Voice: "dsp", Params: map[string]float64{"pitch_semitones": 0, "formant_shift": 0}, Trickle: true}, in)
	c, lag := alignedCorrelation(in, got.PCM)
	t.Logf("aligned at %d samples (%.1f ms of stream offset), correlation %.3f", lag, float64(lag)/48, c)
	if c <= 0.9 {
		t.Errorf("correlation %.3f after alignment, want > 0.9", c)
	}
}

func TestLoopbackPacketLossStaysContinuous(t *testing.T) {
	_, url := startServer(t)
	in := speech(t)
	c, got := roundTrip(t, url, rtcclient.Options{Voice: "dsp", Params: map[string]float64{"pitch_semitones": 0}, DropRate: 0.1, Seed: 7}, in)
	corr, lag := alignedCorrelation(in, got.PCM)
	t.Logf("with 10%% loss: lag %d, correlation %.3f", lag, corr)
	// Every stretch of speech must come back with sound: FEC or PLC fills every lost packet,
	// so no 20 ms frame drops to silence. A dropped frame straddles the 20 ms grid, so the
	// check runs on 10 ms blocks, each of which a lost frame would cover whole at least once.
	// Concealment and the output trim move the audio after them by a few ms, so each block is
	// compared at the lag of its 250 ms window.
	const block, win = 480, 48000 / 4
	speaks := func(from, to int) bool { // every block in [from, to) is speech
		for b := from; b < to; b += block {
			if b < 0 || b+block > len(in) || rms(in[b:b+block]) < 0.02 {
				return false
			}
		}
		return true
	}
	var loud, holes int
	local := lag
	for i := 0; i+block <= len(in); i += block {
		if i%win == 0 && i+win <= len(in) && rms(in[i:i+win]) >= 0.02 {
			local, _ = align(in[i:i+win], got.PCM, i+local-48000*60/1000, i+local+48000*60/1000)
			local -= i
		}
		// Only blocks inside speech, with 20 ms of speech either side: concealment cannot
		// invent a word's onset and may fade its end.
		if !speaks(i-2*block, i+3*block) || local+i+block > len(got.PCM) {
			continue
		}
		loud++
		if r := rms(got.PCM[local+i : local+i+block]); r < 0.002 {
			holes++
			t.Logf("silent block at %d ms (input rms %.3f, output %.4f, lag %d)", i/48, rms(in[i:i+block]), r, local)
		}
	}
	if loud < 50 {
		t.Fatalf("only %d speech blocks compared", loud)
	}
	if holes > 0 {
		t.Errorf("%d of %d speech blocks came back silent under 10%% loss", holes, loud)
	}
	st := c.Stats()
	if len(st) == 0 {
		t.Fatal("no stats")
	}
	p := st[len(st)-1].Packets
	t.Logf("packets: %+v; output queue: %+v", p, st[len(st)-1].Queue) // a trim shifts the alignment

	if p.Lost == 0 || p.FECRecovered+p.PLCFrames == 0 {
		t.Errorf("server saw no loss or recovered nothing: %+v", p)
	}
}
