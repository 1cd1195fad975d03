// Command voxpipe is the voxpipe server and toolbox: a real-time voice pipeline over WebRTC.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"serve", "run the server: web voice changer and WebRTC signaling on http://localhost:8080", runServe},
	{"convert", "convert an audio file (WAV, FLAC, Ogg, MP3) through a voice: convert IN OUT.wav --voice dsp --pitch 4", runConvert},
	{"tts", `speak text with MioTTS: tts --model LM.gguf --codec CODEC.gguf --voice REF.wav "text" -o out.wav`, runTTS},
	{"worker", "join LiveKit rooms as an agent: convert participants' voices or speak text (worker --livekit-url URL --api-key K)", runWorker},
	{"bridge", "live mic → voice → output device (e.g. a virtual cable for OBS)", runBridge},
	{"devices", "list local audio input and output devices", runDevices},
	{"mkmodel", "write a random-weight model file at real or tiny dimensions (for benchmarks), or random original checkpoints (--originals)", runMkmodelOrOriginals},
	{"bench", "benchmarks: bench loopback --sessions N --seconds S --json", runBench},
	{"golden", "check a model family against its golden reference outputs: golden --family miotts", runGolden},
	{"pull", "download a published model into the model cache: pull meanvc2 (pull --list shows the catalog)", runPull},
	{"inspect", "show a GGUF model file: metadata, embedded files, tensors", runInspect},
	{"import", "package original checkpoints (safetensors, torch, TorchScript) as a model file: import --family meanvc2 --from DIR --out F.gguf", runImport},
	{"version", "print the version, the commit it was built from and the Go and CPU it runs on", runVersion},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "voxpipe — real-time voice pipeline\n\nUsage: voxpipe COMMAND [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'voxpipe help COMMAND' (or 'voxpipe COMMAND -h') for the flags of a command.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" && len(args) == 1 {
		usage(stdout)
		return 0
	}
	switch {
	case args[0] == "--version":
		args = []string{"version"}
	case args[0] == "help": // help COMMAND: that command's flags
		args = []string{args[1], "-h"}
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				fmt.Fprintf(stderr, "voxpipe %s: %v\n", c.name, err)
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "voxpipe: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// newFlags makes a flag set that reports errors instead of exiting.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: voxpipe %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// modelFlags are the flags that take a model file, and so also a pulled model's name.
var modelFlags = []string{"model", "vc-model", "tts-model", "codec"}

// parseInterleaved parses flags that may come before or after positional arguments, and
// turns a pulled model's name in a model flag into its file (voxpipe pull).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, resolveModelFlags(fs, modelFlags...)
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: use text or json", format)
}
