package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/voice"
)

func runConvert(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("convert", "convert IN OUT.wav [--voice dsp] [--pitch N] [--formant N] | [--model MEANVC2.gguf --ref REF.wav]\n\nIN (and --ref) may be "+audiofile.Accepted+", detected from the content; OUT is always WAV.", stderr)
	voice := fs.String("voice", "dsp", "voice to convert to (meanvc2 with --model, or meanvc2-120ms / meanvc2-40ms naming the file's variant)")
	pitch := fs.Float64("pitch", 0, "pitch shift in semitones (dsp voice, −12…12)")
	formant := fs.Float64("formant", 0, "formant shift in semitones (dsp voice, −6…6)")
	var vc vcOptions
	vc.flags(fs)
	quiet := fs.Bool("quiet", false, "no progress output")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return errors.New("need IN (an audio file: " + audiofile.Accepted + ") and OUT.wav")
	}
	if !strings.EqualFold(filepath.Ext(pos[1]), ".wav") {
		return fmt.Errorf("%s: only WAV files are written (name it .wav)", pos[1])
	}
	in, err := audiofile.ReadFile(pos[0], audiofile.FileLimits)
	if err != nil {
		return err
	}
	name, proc, done, err := vc.processor(*voice, false)
	if err != nil {
		return err
	}
	defer done()
	if err := applyVoiceParams(proc, *pitch, *formant); err != nil {
		return err
	}
	var progress func(done, total int)
	if !*quiet && isTerminal(stderr) {
		progress = progressBar(stderr, in.SampleRate)
	}
	start := time.Now()
	out, err := convertSamples(in.Mono(), in.SampleRate, name, proc, progress)
	if err != nil {
		return err
	}
	if err := wav.WriteFile(pos[1], out, in.SampleRate, 1); err != nil {
		return err
	}
	took := time.Since(start)
	secs := float64(len(out)) / float64(in.SampleRate)
	if !*quiet {
		fmt.Fprintf(stdout, "converted %.1f s of audio in %.2f s (%.0f× realtime) → %s\n", secs, took.Seconds(), secs/max(took.Seconds(), 1e-9), pos[1])
	}
	return nil
}

// vcOptions select the MeanVC2 voice of convert and bridge: a model file and a reference
// clip of the target voice.
type vcOptions struct {
	model, ref              string
	threads                 int
	backend, vocoderBackend string
}

func (o *vcOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.model, "model", "", "MeanVC2 model (GGUF), either variant (120 ms or 40 ms, read from the file): convert into the voice of --ref")
	fs.StringVar(&o.ref, "ref", "", "reference clip of the target voice ("+audiofile.Accepted+", 1–30 s of speech), with --model")
	fs.IntVar(&o.threads, "threads", min(runtime.NumCPU(), 4), "engine threads for the model")
	fs.StringVar(&o.backend, "backend", defaultBackend, "where the model runs: "+engine.BackendUsage)
	fs.StringVar(&o.vocoderBackend, "vocoder-backend", "", "where the vocoder runs (same values; empty: with the model)")
}

// processor makes the processor for the voice name: MeanVC2 with --model (voice "dsp", the
// default, "meanvc2", or "meanvc2-<variant>" naming the file's variant: 120ms or 40ms),
// otherwise a built-in voice. live picks MeanVC2's live path (20 ms pieces through
// Stream.Write, as a session runs it: bridge); otherwise whole chunks go through the model as
// the reference implementation runs them (convert). done frees what it loaded.
func (o *vcOptions) processor(name string, live bool) (string, stream.Processor, func(), error) {
	isVC := name == "meanvc2" || strings.HasPrefix(name, "meanvc2-")
	if o.model == "" {
		switch {
		case o.ref != "":
			return "", nil, nil, errors.New("--ref needs --model (a MeanVC2 model file)")
		case isVC:
			return "", nil, nil, fmt.Errorf("voice %s needs --model FILE (a MeanVC2 model) and --ref REF.wav", name)
		}
		proc, err := stream.NewRegistry().New(name)
		return name, proc, func() {}, err
	}
	if name != "dsp" && !isVC {
		return "", nil, nil, fmt.Errorf("--model converts with MeanVC2; --voice %q does not go with it", name)
	}
	if name == "dsp" {
		name = "meanvc2"
	}
	if o.ref == "" {
		return "", nil, nil, errors.New("--model needs --ref REF.wav: a clip of the target voice (1–30 s of speech)")
	}
	a, err := audiofile.ReadFile(o.ref, audiofile.FileLimits)
	if err != nil {
		return "", nil, nil, fmt.Errorf("reference clip: %w", err)
	}
	m, closeModel, err := voice.LoadMeanVC2(o.model, placement(o.backend, o.vocoderBackend, "vocoder", o.threads, os.Stderr), "")
	if err != nil {
		return "", nil, nil, err
	}
	if v := m.Config.Runtime.Model; name != "meanvc2" && name != "meanvc2-"+v {
		closeModel()
		return "", nil, nil, fmt.Errorf("--voice %s: %s is the %s MeanVC2 model (voice meanvc2-%s, or meanvc2)", name, o.model, v, v)
	}
	var proc stream.Processor
	if live {
		proc, err = voice.MeanVC2FromClip(m, a.Mono(), a.SampleRate)
	} else {
		proc, err = voice.MeanVC2ReferenceFromClip(m, a.Mono(), a.SampleRate)
	}
	if err != nil {
		closeModel()
		return "", nil, nil, fmt.Errorf("reference clip %s: %w", o.ref, err)
	}
	return name, proc, func() { stream.CloseProcessor(proc); closeModel() }, nil
}

// applyVoiceParams sets the dsp voice's pitch and formant; other voices take none.
func applyVoiceParams(proc stream.Processor, pitch, formant float64) error {
	t, ok := proc.(stream.Tunable)
	if !ok {
		if pitch != 0 || formant != 0 {
			return errors.New("--pitch and --formant apply to the dsp voice only")
		}
		return nil
	}
	return t.SetParams(map[string]float64{"pitch_semitones": pitch, "formant_shift": formant})
}

// convertSamples runs mono audio through a processor with the live session code and returns
// output aligned with the input (latency removed) and of the same length.
func convertSamples(x []float32, rate int, name string, proc stream.Processor, progress func(done, total int)) ([]float32, error) {
	sess, err := stream.NewSession(stream.Config{IORate: rate, MaxQueue: time.Hour}, name, proc)
	if err != nil {
		return nil, err
	}
	skip := sess.LatencyIO()
	out := make([]float32, 0, len(x)+skip+rate)
	buf := make([]float32, rate)
	pull := func() {
		for sess.Queued() > 0 {
			n := sess.Pull(buf[:min(len(buf), sess.Queued())], time.Now())
			out = append(out, buf[:n]...)
		}
	}
	block := rate / 50 // 20 ms, as live audio arrives
	for i := 0; i < len(x); i += block {
		if err := sess.Push(x[i:min(i+block, len(x))], time.Now()); err != nil {
			return nil, err
		}
		pull()
		if progress != nil && (i/block)%250 == 0 {
			progress(i, len(x))
		}
	}
	if err := sess.Drain(); err != nil {
		return nil, err
	}
	pull()
	if progress != nil {
		progress(len(x), len(x))
	}
	out = out[min(skip, len(out)):]
	if len(out) < len(x) {
		out = append(out, make([]float32, len(x)-len(out))...)
	}
	return out[:len(x)], nil
}

// progressBar draws a one-line bar on a terminal.
func progressBar(w io.Writer, rate int) func(done, total int) {
	start := time.Now()
	return func(done, total int) {
		frac := float64(done) / float64(max(total, 1))
		bar := progressCells(frac)
		speed := float64(done) / float64(rate) / max(time.Since(start).Seconds(), 1e-9)
		fmt.Fprintf(w, "\r[%s] %3.0f%%  %.1f/%.1f s  %.0f× realtime", bar, frac*100, float64(done)/float64(rate), float64(total)/float64(rate), speed)
		if done >= total {
			fmt.Fprintln(w)
		}
	}
}

// progressCells is a 30-cell bar filled to frac (0…1): the [####    ] of every progress line.
func progressCells(frac float64) string {
	const width = 30
	n := min(max(int(math.Ceil(frac*width)), 0), width)
	return strings.Repeat("#", n) + strings.Repeat(" ", width-n)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
