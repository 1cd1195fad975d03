package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/gen2brain/malgo"

	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/vulkan"
)

// backendNull is miniaudio's ma_backend_null. malgo's BackendNull constant is one short: it
// names ma_backend_custom, which miniaudio's enum has just before null.
const backendNull = malgo.Backend(malgo.BackendNull + 1)

var backends = map[string]malgo.Backend{
	"alsa": malgo.BackendAlsa, "pulse": malgo.BackendPulseaudio, "jack": malgo.BackendJack,
	"wasapi": malgo.BackendWasapi, "coreaudio": malgo.BackendCoreaudio, "null": backendNull,
}

// audioContext opens miniaudio with one backend, or its default order when name is "".
func audioContext(name string) (*malgo.AllocatedContext, error) {
	var list []malgo.Backend
	if name != "" {
		b, ok := backends[name]
		if !ok {
			return nil, fmt.Errorf("unknown audio backend %q (alsa, pulse, jack, wasapi, coreaudio, null)", name)
		}
		list = []malgo.Backend{b}
	}
	ctx, err := malgo.InitContext(list, malgo.ContextConfig{}, nil)
	if err != nil {
		return nil, fmt.Errorf("audio backend: %w", err)
	}
	return ctx, nil
}

func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("devices", "devices [--backend NAME] [--gpu]", stderr)
	backend := fs.String("backend", "", "audio backend (default: the platform's first that works)")
	gpu := fs.Bool("gpu", false, "list the Vulkan devices (GPUs, and software ones such as lavapipe) instead of audio devices")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *gpu {
		return listGPUs(stdout)
	}
	ctx, err := audioContext(*backend)
	if err != nil {
		return err
	}
	defer func() { _ = ctx.Uninit(); ctx.Free() }()
	for _, kind := range []struct {
		t    malgo.DeviceType
		name string
	}{{malgo.Capture, "Inputs"}, {malgo.Playback, "Outputs"}} {
		devs, err := ctx.Devices(kind.t)
		if err != nil {
			return fmt.Errorf("list %s: %w", strings.ToLower(kind.name), err)
		}
		fmt.Fprintf(stdout, "%s:\n", kind.name)
		if len(devs) == 0 {
			fmt.Fprintln(stdout, "  (none)")
		}
		for i, d := range devs {
			def := ""
			if d.IsDefault != 0 {
				def = " (default)"
			}
			fmt.Fprintf(stdout, "  %d: %s%s\n", i, d.Name(), def)
		}
	}
	fmt.Fprintln(stdout, "\nUse the number or a part of the name with 'voxpipe bridge --in DEV --out DEV'.")
	return nil
}

// listGPUs prints the Vulkan devices: index, name, kind, Vulkan version, device-local
// memory, subgroup size and the shader number formats they support.
func listGPUs(stdout io.Writer) error {
	devs, err := vulkan.Devices()
	if err != nil {
		return fmt.Errorf("no Vulkan here (%w); voxpipe runs its models on the CPU", err)
	}
	if len(devs) == 0 {
		fmt.Fprintln(stdout, "Vulkan works but lists no device; voxpipe runs its models on the CPU.")
		return nil
	}
	fmt.Fprintln(stdout, "Vulkan devices:")
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	for _, d := range devs {
		fmt.Fprintf(stdout, "  %d: %s — %s, Vulkan %s, %d MiB device memory (buffers up to %d MiB), subgroup %d (arithmetic %s), fp16 %s, int8 %s, int8 dot products %s\n",
			d.Index, d.Name, d.Type, d.APIVersion, d.DeviceLocalBytes>>20, d.MaxBufferBytes>>20, d.SubgroupSize, yes(d.SubgroupArith), yes(d.FP16), yes(d.Int8), yes(d.DotI8))
	}
	return nil
}

// findDevice picks a device by index or by a case-insensitive part of its name ("" = default).
func findDevice(ctx *malgo.AllocatedContext, kind malgo.DeviceType, want string) (*malgo.DeviceInfo, error) {
	if want == "" || want == "default" {
		return nil, nil
	}
	devs, err := ctx.Devices(kind)
	if err != nil {
		return nil, err
	}
	if i, err := strconv.Atoi(want); err == nil {
		if i < 0 || i >= len(devs) {
			return nil, fmt.Errorf("device %d does not exist (there are %d; see 'voxpipe devices')", i, len(devs))
		}
		return &devs[i], nil
	}
	for i := range devs {
		if strings.Contains(strings.ToLower(devs[i].Name()), strings.ToLower(want)) {
			return &devs[i], nil
		}
	}
	return nil, fmt.Errorf("no device matches %q (see 'voxpipe devices')", want)
}

// bridgeOptions configure a device bridge.
type bridgeOptions struct {
	backend, in, out string
	voice            string
	vc               vcOptions // MeanVC2 model and reference clip
	pitch, formant   float64
	rate             int           // 0: the devices' native rate
	period           time.Duration // device period
	readout          io.Writer     // live one-line status (nil: none)
	verbose          io.Writer     // the audio system's own messages (nil: hidden)
}

// bridgeReport is what a finished bridge ran.
type bridgeReport struct {
	rate      int
	frames    int64
	stats     stream.Stats
	algorithm time.Duration
}

func runBridge(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bridge", "bridge --in DEV --out DEV [--voice dsp] [--pitch N] [--formant N] | [--model MEANVC2.gguf --ref REF.wav]", stderr)
	o := bridgeOptions{readout: stderr}
	// --backend is where the model runs, as on every command that runs one (vcOptions).
	fs.StringVar(&o.backend, "audio-backend", "", "audio system (alsa, pulse, jack, wasapi, coreaudio, null; empty: the platform's default)")
	fs.StringVar(&o.in, "in", "", "input device: number or part of the name from 'voxpipe devices' (default device if empty)")
	fs.StringVar(&o.out, "out", "", "output device, e.g. a virtual cable that OBS captures (default device if empty)")
	fs.StringVar(&o.voice, "voice", "dsp", "voice (meanvc2 with --model, or meanvc2-120ms / meanvc2-40ms naming the file's variant)")
	o.vc.flags(fs)
	fs.Float64Var(&o.pitch, "pitch", 0, "pitch shift in semitones (dsp voice)")
	fs.Float64Var(&o.formant, "formant", 0, "formant shift in semitones (dsp voice)")
	fs.IntVar(&o.rate, "rate", 0, "device sample rate in Hz (0: the device's own)")
	fs.DurationVar(&o.period, "period", 10*time.Millisecond, "device period (smaller: lower latency, more risk of glitches)")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	verbose := fs.Bool("verbose", false, "show the audio system's own messages (ALSA prints many while it probes for devices)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *verbose {
		o.verbose = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	rep, err := bridge(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nbridge stopped: %.1f s at %d Hz, %d late chunks, %d drops, %d underflows\n",
		float64(rep.frames)/float64(rep.rate), rep.rate, rep.stats.LateChunks, rep.stats.DroppedChunks, rep.stats.Underflows)
	return nil
}

// bridge runs input device → session → output device until ctx ends.
func bridge(ctx context.Context, o bridgeOptions) (*bridgeReport, error) {
	var actx *malgo.AllocatedContext
	err := o.quiet(func() (err error) {
		actx, err = audioContext(o.backend)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = actx.Uninit(); actx.Free() }()
	inDev, err := findDevice(actx, malgo.Capture, o.in)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	outDev, err := findDevice(actx, malgo.Playback, o.out)
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	name, proc, done, err := o.vc.processor(o.voice, true) // the live path, as a session runs it
	if err != nil {
		return nil, err
	}
	defer done() // runs after dev.Uninit, deferred below: no callback uses the model then
	if err := applyVoiceParams(proc, o.pitch, o.formant); err != nil {
		return nil, err
	}

	cfg := malgo.DefaultDeviceConfig(malgo.Duplex)
	cfg.Capture.Format, cfg.Capture.Channels = malgo.FormatF32, 1
	cfg.Playback.Format, cfg.Playback.Channels = malgo.FormatF32, 1
	if inDev != nil {
		cfg.Capture.DeviceID = inDev.ID.Pointer()
	}
	if outDev != nil {
		cfg.Playback.DeviceID = outDev.ID.Pointer()
	}
	cfg.SampleRate = uint32(o.rate)
	cfg.PeriodSizeInMilliseconds = uint32(max(o.period.Milliseconds(), 1))
	cfg.PerformanceProfile = malgo.LowLatency

	var (
		mu     sync.Mutex
		sess   *stream.Session
		frames int64
		work   time.Duration
		perr   error
	)
	data := func(out, in []byte, n uint32) {
		// Runs on the audio thread: no allocation, no blocking beyond the session lock.
		src := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(in))), int(n))
		dst := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(out))), int(n))
		t0 := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if sess == nil {
			clear(dst)
			return
		}
		if err := sess.Push(src, t0); err != nil && perr == nil {
			perr = err
		}
		sess.Pull(dst, t0)
		frames += int64(n)
		work += time.Since(t0)
	}
	var dev *malgo.Device
	err = o.quiet(func() (err error) {
		dev, err = malgo.InitDevice(actx.Context, cfg, malgo.DeviceCallbacks{Data: data})
		return err
	})
	if err != nil {
		hint := ""
		if o.verbose == nil {
			hint = "; --verbose shows the audio system's messages"
		}
		return nil, fmt.Errorf("open the input %s and the output %s: %w (is a microphone connected and not held by another program? 'voxpipe devices' lists this machine's devices%s)",
			deviceName(inDev), deviceName(outDev), err, hint)
	}
	defer dev.Uninit()
	rate := int(dev.SampleRate())
	s, err := stream.NewSession(stream.Config{IORate: rate}, name, proc)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	sess = s
	mu.Unlock()
	if err := dev.Start(); err != nil {
		return nil, fmt.Errorf("start devices: %w", err)
	}
	alg := s.AlgorithmicLatency() + 2*o.period
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var lastWork time.Duration
	var lastFrames int64
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		mu.Lock()
		st, f, w, err := s.Stats(), frames, work, perr
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		if o.readout != nil {
			load := 0.0
			if df := f - lastFrames; df > 0 {
				load = float64(w-lastWork) / (float64(df) / float64(rate) * float64(time.Second))
			}
			pipeline := float64(st.Latency.Microseconds()) / 1000
			devices := float64(2*o.period.Microseconds()) / 1000
			fmt.Fprintf(o.readout, "\r%d Hz | latency %5.1f ms (pipeline %.1f + device periods %.0f) | load %5.1f%% | late %d | dropped %d ",
				rate, pipeline+devices, pipeline, devices, 100*load, st.LateChunks, st.DroppedChunks)
		}
		lastWork, lastFrames = w, f
	}
	if err := dev.Stop(); err != nil {
		return nil, errors.Join(errors.New("stop devices"), err)
	}
	mu.Lock()
	defer mu.Unlock()
	return &bridgeReport{rate: rate, frames: frames, stats: s.Stats(), algorithm: alg}, nil
}

// quiet runs f, a call into the audio system, with the C libraries' stderr captured: shown
// with --verbose, dropped otherwise.
func (o bridgeOptions) quiet(f func() error) error {
	noise, err := captureStderr(f)
	if o.verbose != nil && noise != "" {
		io.WriteString(o.verbose, noise)
	}
	return err
}

func deviceName(d *malgo.DeviceInfo) string {
	if d == nil {
		return "(default device)"
	}
	return fmt.Sprintf("%q", d.Name())
}
