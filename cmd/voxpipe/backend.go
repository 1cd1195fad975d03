package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/models/qwen3"
)

// defaultBackend is where models run when --backend is not given: the CPU, whose kernels
// are measured and tuned; the Vulkan shaders pass every golden stage but have not yet been
// timed on a real GPU, so a GPU is asked for with --backend auto or vulkan.
const defaultBackend = "cpu"

// placement is a command's --backend, its part override (the part named partName) and
// --threads, logging auto's choice to w.
func placement(backend, part, partName string, threads int, w io.Writer) engine.Placement {
	return engine.Placement{Backend: backend, Part: part, PartName: partName, Threads: threads,
		Log: func(format string, args ...any) { fmt.Fprintf(w, format, args...) }}
}

// placementFlags adds serve's and worker's --backend, --vocoder-backend and --codec-backend.
func placementFlags(fs *flag.FlagSet, o *serveOptions) {
	fs.StringVar(&o.backend, "backend", defaultBackend, "where the models run: "+engine.BackendUsage)
	fs.StringVar(&o.vocoderBackend, "vocoder-backend", "", "where MeanVC2's vocoder runs (same values; empty: with the model)")
	fs.StringVar(&o.codecBackend, "codec-backend", "", "where MioTTS's codec (MioCodec) runs (same values; empty: with the language model)")
	fs.StringVar(&o.kvCache, "kv-cache", "auto", "MioTTS's language model KV cache: "+qwen3.KVCacheUsage)
}

// serverPlacement is --backend and one part's override of a benchmark that starts a server
// (bench loopback, tts-load, soak), passed on to its serve command.
type serverPlacement struct{ backend, part, partFlag string }

// serverPlacementFlags adds --backend and partFlag (vocoder-backend or codec-backend).
func serverPlacementFlags(fs *flag.FlagSet, partFlag, partUsage string) *serverPlacement {
	p := &serverPlacement{partFlag: partFlag}
	fs.StringVar(&p.backend, "backend", defaultBackend, "where the started server runs the models: "+engine.BackendUsage)
	fs.StringVar(&p.part, partFlag, "", partUsage+" (same values; empty: with the model)")
	return p
}

// args are the serve flags they become.
func (p *serverPlacement) args() []string {
	a := []string{"--backend", p.backend}
	if p.part != "" {
		a = append(a, "--"+p.partFlag, p.part)
	}
	return a
}

// gpuPart is a model part on a backend with memory of its own.
type gpuPart struct {
	model, part string
	sessions    string // the sessions it serves, as metrics.DeviceMemory takes them: "vc" or "tts"
	be          engine.Backend
	mem         engine.MemoryReporter
}

// placement is the package's placement that also notes the GPU backends it opens, for
// nameGPUParts to name once the model is loaded.
func (a *app) placement(backend, part, partName string, threads int, w io.Writer) engine.Placement {
	pl := placement(backend, part, partName, threads, w)
	pl.Opened = func(role string, be engine.Backend) {
		if m, ok := be.(engine.MemoryReporter); ok {
			a.gpus = append(a.gpus, gpuPart{part: role, be: be, mem: m})
		}
	}
	return pl
}

// nameGPUParts names the GPU parts opened since the last call after the model they hold and
// the sessions it serves ("vc" or "tts").
func (a *app) nameGPUParts(model, sessions string) {
	for i := range a.gpus {
		if a.gpus[i].model == "" {
			a.gpus[i].model, a.gpus[i].sessions = model, sessions
		}
	}
}
