package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/voxpipe/voxpipe/vulkan"
)

// BackendUsage is the help text of a --backend flag's values; each flag says what runs there.
const BackendUsage = "auto (a discrete GPU through Vulkan if there is one, else the CPU), cpu, vulkan (the first GPU, else the first Vulkan device) or vulkan:N (device N of voxpipe devices --gpu)"

// BackendSpec is a parsed --backend value.
type BackendSpec struct {
	Kind   string // "auto", "cpu" or "vulkan"
	Device int    // Vulkan device index; -1: pick one
}

func (s BackendSpec) String() string {
	if s.Kind == "vulkan" && s.Device >= 0 {
		return fmt.Sprintf("vulkan:%d", s.Device)
	}
	return s.Kind
}

// ParseBackend parses auto, cpu, vulkan or vulkan:N ("" is auto).
func ParseBackend(s string) (BackendSpec, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "", "auto":
		return BackendSpec{Kind: "auto", Device: -1}, nil
	case "cpu":
		return BackendSpec{Kind: "cpu", Device: -1}, nil
	case "vulkan", "gpu":
		return BackendSpec{Kind: "vulkan", Device: -1}, nil
	}
	if rest, ok := strings.CutPrefix(s, "vulkan:"); ok {
		if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
			return BackendSpec{Kind: "vulkan", Device: n}, nil
		}
	}
	return BackendSpec{}, fmt.Errorf("backend %q: use auto, cpu, vulkan or vulkan:N", s)
}

// OpenBackend opens the backend spec names: the CPU with threads threads, or a Vulkan
// device. auto takes a discrete GPU when Vulkan lists one and the CPU otherwise; note then
// says in one line why (no loader, no GPU), for the caller to log. An explicit vulkan that
// cannot open is an error naming the reason.
func OpenBackend(spec BackendSpec, threads int) (be Backend, note string, err error) {
	switch spec.Kind {
	case "cpu":
		c, err := NewCPU(threads)
		return c, "", err
	case "vulkan":
		idx := spec.Device
		if idx < 0 {
			devs, err := vulkan.Devices()
			if err != nil {
				return nil, "", fmt.Errorf("--backend vulkan: no Vulkan (%w); --backend auto or cpu runs on the CPU", err)
			}
			if idx = pickDevice(devs, false); idx < 0 {
				return nil, "", fmt.Errorf("--backend vulkan: Vulkan lists no device")
			}
		}
		v, err := NewVulkan(idx)
		return v, "", err
	case "auto":
		devs, derr := vulkan.Devices()
		idx := -1
		if derr == nil {
			idx = pickDevice(devs, true)
		}
		if idx >= 0 {
			v, verr := NewVulkan(idx)
			if verr == nil {
				return v, "", nil
			}
			derr = verr
		}
		c, err := NewCPU(threads)
		switch {
		case derr != nil:
			note = fmt.Sprintf("running on the CPU: no Vulkan (%v)", derr)
		default:
			note = "running on the CPU: Vulkan lists no discrete GPU (--backend vulkan uses another device)"
		}
		return c, note, err
	}
	return nil, "", fmt.Errorf("backend %q: use auto, cpu, vulkan or vulkan:N", spec.Kind)
}

// pickDevice is the first discrete GPU, else (unless discreteOnly) the first GPU of any
// kind, else the first device; -1 when none fits.
func pickDevice(devs []vulkan.DeviceInfo, discreteOnly bool) int {
	for _, d := range devs {
		if d.Type == vulkan.Discrete {
			return d.Index
		}
	}
	if discreteOnly {
		return -1
	}
	for _, d := range devs {
		if d.Type == vulkan.Integrated || d.Type == vulkan.Virtual {
			return d.Index
		}
	}
	if len(devs) > 0 {
		return devs[0].Index
	}
	return -1
}

// MemoryReporter is a backend with memory of its own (a GPU's), reported apart from the
// process's.
type MemoryReporter interface {
	MemoryInUse() (device, host int64)
	MemoryPeak() int64
}

// Profiler is a backend that times the nodes of its runs (the bench commands' --profile).
type Profiler interface {
	StartProfile()
	StopProfile() ([]OpTime, []ShapeTime)
}

// Placement says where a model runs: Backend for the model, Part for the one part a command
// lets users place apart (MeanVC2's vocoder, MioTTS's codec; "" keeps it with the model),
// Threads for a CPU backend. Log, when set, gets auto's one line saying why it chose the CPU.
type Placement struct {
	Backend, Part string
	PartName      string // what the part is ("vocoder", "codec"), for Opened
	Threads       int
	Log           func(format string, args ...any)
	// Opened, when set, hears of every backend opened: role "model", the part's name (or
	// "part") or "speaker".
	Opened func(role string, be Backend)
}

// Open opens the model's backend and the part's (the same backend when Part is empty or
// names the same place); close frees both.
func (p Placement) Open() (main, part Backend, close func(), err error) {
	ms, err := ParseBackend(p.Backend)
	if err != nil {
		return nil, nil, nil, err
	}
	if main, err = p.open(ms, "model"); err != nil {
		return nil, nil, nil, err
	}
	if strings.TrimSpace(p.Part) == "" {
		return main, main, main.Close, nil
	}
	ps, err := ParseBackend(p.Part)
	if err != nil {
		main.Close()
		return nil, nil, nil, err
	}
	if ps == ms {
		return main, main, main.Close, nil
	}
	role := p.PartName
	if role == "" {
		role = "part"
	}
	if part, err = p.open(ps, role); err != nil {
		main.Close()
		return nil, nil, nil, err
	}
	return main, part, func() { part.Close(); main.Close() }, nil
}

// OpenSpeaker opens one more backend where the model runs (MeanVC2's speaker path has its
// own); Open has logged auto's choice already.
func (p Placement) OpenSpeaker() (Backend, error) {
	ms, err := ParseBackend(p.Backend)
	if err != nil {
		return nil, err
	}
	be, _, err := OpenBackend(ms, p.Threads)
	if err == nil && p.Opened != nil {
		p.Opened("speaker", be)
	}
	return be, err
}

func (p Placement) open(s BackendSpec, role string) (Backend, error) {
	be, note, err := OpenBackend(s, p.Threads)
	if err != nil {
		return nil, err
	}
	if note != "" && p.Log != nil {
		p.Log("%s\n", note)
	}
	if v, ok := be.(*Vulkan); ok && p.Log != nil {
		p.Log("%s: %s\n", v.Name(), v.dev.LinearPaths())
	}
	if p.Opened != nil {
		p.Opened(role, be)
	}
	return be, nil
}
