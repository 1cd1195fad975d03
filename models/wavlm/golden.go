package wavlm

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/weights"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// goldenTol is the manifests' tolerance for every WavLM stage (max |diff| / max |expected|).
const goldenTol = 1e-4

// GoldenMeanVC2 checks the spk.wavlm.* cases of the meanvc2 golden folder: src is the
// `speaker_wavlm/` namespace of its model.gguf (WavLM-Large switches). The reference waveform
// input.ref_wav goes through the whole encoder; conv_features are compared channels first
// [C, T], post_extract_proj [T, hidden] and hidden_states [layers+1, T, hidden] (the last one
// after encoder.layer_norm).
func GoldenMeanVC2(r *parity.Run, src weights.Source, backend engine.Backend) {
	names := []string{"spk.wavlm.conv_features", "spk.wavlm.post_extract_proj", "spk.wavlm.hidden_states"}
	failAll := func(err error) {
		for _, n := range names {
			r.Fail(n, err)
		}
	}
	m, err := Load(src, backend, Options{})
	if err != nil {
		failAll(err)
		return
	}
	defer m.Close()
	if m.Config.Variant != VariantLarge {
		failAll(fmt.Errorf("wavlm: meanvc2 speaker WavLM inferred as %s, want large", m.Config.Variant))
		return
	}
	wave, _, err := r.F32("input.ref_wav")
	if err != nil {
		failAll(err)
		return
	}
	layers := make([]int, m.Config.Layers+1)
	for i := range layers {
		layers[i] = i
	}
	res, err := m.Forward(wave, layers, true)
	if err != nil {
		failAll(err)
		return
	}
	r.Check(names[0], res.ConvFeatures, goldenTol)
	r.Check(names[1], res.Projected, goldenTol)
	var all []float32
	for _, s := range res.States {
		all = append(all, s...)
	}
	r.Check(names[2], all, goldenTol)
}
