package ecapa

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// Tolerance of the spk.ecapa.* and spk.embedding golden stages (MANIFEST §5).
const goldenTol = 1e-4

// GoldenECAPA checks the head against the meanvc2 golden cases, teacher-forced from
// spk.wavlm.hidden_states: spk.ecapa.instance_norm, layer1…layer4, conv, pooling, bn and
// spk.embedding. m is the family's model.gguf (namespace speaker_ecapa/ and the embedded
// config.json). Stages are recorded in r; the error is for what kept the checks from running.
func GoldenECAPA(r *parity.Run, m *gguf.Model, backend engine.Backend) error {
	cfg := DefaultConfig()
	if raw, ok := m.EmbeddedFile("config.json"); ok {
		var err error
		if cfg, err = ParseConfig(raw); err != nil {
			return err
		}
	}
	head, err := LoadConfig(m.Sub("speaker_ecapa"), cfg, backend)
	if err != nil {
		return err
	}
	defer head.Close()
	hs, shape, err := r.F32("spk.wavlm.hidden_states")
	if err != nil {
		return fmt.Errorf("ecapa golden: %w", err)
	}
	if len(shape) != 3 {
		return fmt.Errorf("ecapa golden: spk.wavlm.hidden_states has shape %v, want [layers, T, hidden]", shape)
	}
	st, err := head.Stages(hs, shape[1])
	if err != nil {
		for _, n := range stageNames {
			r.Fail(caseName(n), err)
		}
		return nil
	}
	for _, n := range stageNames {
		r.Check(caseName(n), st[n], goldenTol)
	}
	return nil
}

func caseName(stage string) string {
	if stage == "embedding" {
		return "spk.embedding"
	}
	return "spk.ecapa." + stage
}
