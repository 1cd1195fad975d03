package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/voxpipe/voxpipe/dsp/audiofile"
	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/miotts"
	"github.com/voxpipe/voxpipe/models/qwen3"
)

func runTTS(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tts", `tts --model LM.gguf --codec CODEC.gguf --voice REF.wav "text" -o out.wav   (-o - streams raw 16-bit PCM to stdout)`, stderr)
	model := fs.String("model", "", "MioTTS language model (GGUF)")
	codec := fs.String("codec", "", "MioCodec model (GGUF)")
	voice := fs.String("voice", "", "reference clip whose voice to speak with ("+audiofile.Accepted+")")
	out := fs.String("o", "", "output WAV file, or - for raw 16-bit little-endian mono PCM on stdout at the codec's rate")
	textFile := fs.String("text-file", "", "read the text from this file (- for stdin) instead of the argument")
	threads := fs.Int("threads", min(runtime.NumCPU(), 4), "engine threads")
	backend := fs.String("backend", defaultBackend, "where the models run: "+engine.BackendUsage)
	codecBackend := fs.String("codec-backend", "", "where the codec runs (same values; empty: with the language model)")
	kvCache := fs.String("kv-cache", "auto", "the language model's KV cache: "+qwen3.KVCacheUsage)
	seed := fs.Uint64("seed", 0, "sampling seed (0: the fixed default, so runs repeat)")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: the model's default)")
	maxTokens := fs.Int("max-tokens", 0, "speech tokens per sentence group at most (0: the model's default, 700 = 28 s)")
	ramp := fs.String("ramp", "", "cores of the first codec windows, e.g. 4,8,16 (default 4,6,10,16; smaller starts audio sooner, if tokens come fast enough to keep up: slower ones start later in the ramp; \"none\" for whole windows from the start)")
	cacheDir := fs.String("voice-cache", defaultVoiceCacheDir(), "directory keeping speaker embeddings between runs (\"\" for none)")
	quiet := fs.Bool("quiet", false, "no progress output")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	text := strings.Join(pos, " ")
	if *textFile != "" {
		var b []byte
		if *textFile == "-" {
			b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
		} else {
			b, err = os.ReadFile(*textFile)
		}
		if err != nil {
			return err
		}
		text = string(b)
	}
	switch {
	case *model == "" || *codec == "":
		fs.Usage()
		return errors.New("--model and --codec are required")
	case *voice == "":
		fs.Usage()
		return errors.New("--voice REF.wav is required: MioTTS speaks in the voice of a reference clip")
	case *out == "":
		fs.Usage()
		return errors.New("-o OUT.wav (or -o - for raw PCM on stdout) is required")
	case *out != "-" && !strings.EqualFold(filepath.Ext(*out), ".wav"):
		return fmt.Errorf("-o %s: only WAV files are written (name it .wav), or - for raw PCM on stdout", *out)
	case strings.TrimSpace(text) == "":
		fs.Usage()
		return errors.New("no text given")
	case !miotts.Speakable(text):
		return errors.New("the text has nothing to say (no letters or digits)")
	}
	if _, _, err := qwen3.ParseKVCache(*kvCache); err != nil {
		return fmt.Errorf("--kv-cache: %w", err)
	}
	ref, err := audiofile.ReadFile(*voice, audiofile.FileLimits)
	if err != nil {
		return fmt.Errorf("--voice: %w", err)
	}
	logf := func(format string, a ...any) {
		if !*quiet {
			fmt.Fprintf(stderr, format, a...)
		}
	}
	be, codecBE, closeBE, err := placement(*backend, *codecBackend, "codec", *threads, stderr).Open()
	if err != nil {
		return err
	}
	defer closeBE()
	t0 := time.Now()
	logf("loading %s and %s…\n", *model, *codec)
	var rampCores []int
	switch *ramp {
	case "":
	case "none":
		rampCores = []int{}
	default:
		for _, f := range strings.Split(*ramp, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("--ramp %q: give positive token counts like 4,8,16", *ramp)
			}
			rampCores = append(rampCores, n)
		}
	}
	tts, err := miotts.Load(*model, *codec, be, miotts.Options{VoiceCacheDir: *cacheDir, Ramp: rampCores, CodecBackend: codecBE, KVCache: *kvCache})
	if err != nil {
		return err
	}
	defer tts.Close()
	logf("loaded in %.1f s; embedding the voice…\n", time.Since(t0).Seconds())
	t1 := time.Now()
	emb, err := tts.Embed(ref.Mono(), ref.SampleRate)
	if err != nil {
		return fmt.Errorf("--voice %s: %w", *voice, err)
	}
	logf("voice ready in %.2f s\n", time.Since(t1).Seconds())

	rate := tts.SampleRate()
	var sink func([]float32) error
	var finish func() error
	if *out == "-" {
		buf := make([]byte, 0, 8192)
		sink = func(x []float32) error {
			buf = buf[:0]
			for _, v := range x {
				buf = binary.LittleEndian.AppendUint16(buf, uint16(int16(math.Round(float64(max(-1, min(1, v)))*32767))))
			}
			_, err := os.Stdout.Write(buf)
			return err
		}
		finish = func() error { return nil }
	} else {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		w, err := wav.NewWriter(f, rate, 1)
		if err != nil {
			f.Close()
			return err
		}
		sink = w.Write
		finish = func() error {
			if err := w.Close(); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	req := miotts.Request{Text: text, Embedding: emb,
		Gen: miotts.GenOptions{Seed: *seed, MaxNew: *maxTokens}}
	if *temp > 0 {
		sc := tts.LM.Defaults
		sc.Temperature = *temp
		req.Gen.Sampler = &sc
	}
	var got int
	start := time.Now()
	progress := !*quiet && isTerminal(stderr)
	st, err := tts.Synthesize(ctx, req, func(c miotts.Chunk) error {
		if got == 0 && len(c.Samples) > 0 {
			logf("first audio after %.0f ms\n", float64(time.Since(start).Microseconds())/1000)
		}
		got += len(c.Samples)
		if progress {
			fmt.Fprintf(stderr, "\r%.1f s of audio", float64(got)/float64(rate))
		}
		return sink(c.Samples)
	})
	if progress {
		fmt.Fprintln(stderr)
	}
	if ferr := finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	took := time.Since(start)
	audio := float64(st.Samples) / float64(rate)
	logf("%d speech tokens → %.2f s of audio in %.2f s (RTF %.3f; prefill %v, LM decode %.1f tokens/s, codec RTF %.3f)\n",
		st.Tokens, audio, took.Seconds(), took.Seconds()/math.Max(audio, 1e-9), st.Prefill.Round(time.Millisecond),
		float64(st.Tokens)/math.Max(st.Decode.Seconds(), 1e-9), st.Codec.Seconds()/math.Max(audio, 1e-9))
	if *out != "-" && !*quiet {
		fmt.Fprintf(stdout, "wrote %s (%.2f s, %d Hz)\n", *out, audio, rate)
	}
	return nil
}

// defaultVoiceCacheDir is where speaker embeddings are kept between runs.
func defaultVoiceCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return d + string(os.PathSeparator) + "voxpipe" + string(os.PathSeparator) + "embeddings"
}
