package engine

import (
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/internal/vulkantest"
	"github.com/voxpipe/voxpipe/vulkan"
)

func TestParseBackend(t *testing.T) {
	for in, want := range map[string]string{"": "auto", "auto": "auto", "CPU": "cpu", "vulkan": "vulkan", " vulkan:2 ": "vulkan:2", "gpu": "vulkan"} {
		s, err := ParseBackend(in)
		if err != nil || s.String() != want {
			t.Errorf("ParseBackend(%q) = %v, %v; want %s", in, s, err, want)
		}
	}
	for _, bad := range []string{"cuda", "vulkan:", "vulkan:-1", "vulkan:x", "cpu:1"} {
		if _, err := ParseBackend(bad); err == nil || !strings.Contains(err.Error(), "auto, cpu, vulkan or vulkan:N") {
			t.Errorf("ParseBackend(%q): error %v", bad, err)
		}
	}
}

// auto takes a discrete GPU only: here (lavapipe, a CPU device) it is the CPU, with a note
// saying why; vulkan takes lavapipe; a device that does not exist is an error naming it.
func TestOpenBackend(t *testing.T) {
	vulkantest.Require(t)
	devs, err := vulkan.Devices()
	if err != nil {
		t.Fatal(err)
	}
	discrete := false
	for _, d := range devs {
		discrete = discrete || d.Type == vulkan.Discrete
	}
	auto, _ := ParseBackend("auto")
	be, note, err := OpenBackend(auto, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, isCPU := be.(*CPU)
	t.Logf("auto: %s (%s)", be.Name(), note)
	if isCPU == discrete || isCPU != (note != "") {
		t.Errorf("auto opened %s with note %q; a discrete GPU here: %v", be.Name(), note, discrete)
	}
	be.Close()
	vk, _ := ParseBackend("vulkan")
	if be, _, err = OpenBackend(vk, 1); err != nil {
		t.Fatal(err)
	}
	if _, ok := be.(*Vulkan); !ok {
		t.Errorf("vulkan opened %s", be.Name())
	}
	be.Close()
	if _, _, err := OpenBackend(BackendSpec{Kind: "vulkan", Device: 99}, 1); err == nil || !strings.Contains(err.Error(), "no device 99") {
		t.Errorf("vulkan:99: %v", err)
	}
	// A placement with the part elsewhere opens two backends; the same place shares one.
	var roles []string
	pl := Placement{Backend: "vulkan", Part: "cpu", PartName: "vocoder", Threads: 1,
		Opened: func(role string, be Backend) { roles = append(roles, role+"="+strings.SplitN(be.Name(), ":", 2)[0]) }}
	main, part, closeAll, err := pl.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := part.(*CPU); !ok || main == part {
		t.Errorf("vulkan + cpu part: %s, %s", main.Name(), part.Name())
	}
	spk, err := pl.OpenSpeaker()
	if err != nil {
		t.Fatal(err)
	}
	spk.Close()
	closeAll()
	if strings.Join(roles, " ") != "model=vulkan vocoder=cpu(1 threads) speaker=vulkan" {
		t.Errorf("opened %v", roles)
	}
	main, part, closeAll, err = Placement{Backend: "cpu", Part: "CPU", Threads: 1}.Open()
	if err != nil || main != part {
		t.Errorf("cpu + cpu part: %v, shared %v", err, main == part)
	}
	closeAll()
}
