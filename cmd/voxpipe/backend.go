package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/voxpipe/voxpipe/engine"
)

// defaultBackend is where models run when --backend is not given: the CPU, whose kernels
// are measured and tuned; the Vulkan shaders pass every golden stage but have not yet been
// timed on a real GPU, so a GPU is asked for with --backend auto or vulkan.
const defaultBackend = "cpu"

// backendFlag adds --NAME (a backend: engine.ParseBackend's values) to fs.
func backendFlag(fs *flag.FlagSet, name, def, what string) *string {
	usage := engine.BackendUsage
	if what != "" {
		usage = what + ": " + usage + "; empty: with the model"
	}
	return fs.String(name, def, usage)
}

// placement is a command's --backend, part override and --threads, logging auto's choice to w.
func placement(backend, part string, threads int, w io.Writer) engine.Placement {
	return engine.Placement{Backend: backend, Part: part, Threads: threads,
		Log: func(format string, args ...any) { fmt.Fprintf(w, format, args...) }}
}

// placementFlags adds serve's and worker's --backend, --vocoder-backend and --codec-backend.
func placementFlags(fs *flag.FlagSet, o *serveOptions) {
	fs.StringVar(&o.backend, "backend", defaultBackend, "where the models run: "+engine.BackendUsage)
	fs.StringVar(&o.vocoderBackend, "vocoder-backend", "", "where MeanVC2's vocoder runs (same values; empty: with the model)")
	fs.StringVar(&o.codecBackend, "codec-backend", "", "where MioTTS's codec (MioCodec) runs (same values; empty: with the language model)")
}
