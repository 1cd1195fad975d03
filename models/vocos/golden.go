package vocos

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// Tolerance of the voc.* golden stages (MANIFEST §5).
const goldenTol = 1e-4

// GoldenVocos checks the streaming vocoder against the meanvc2 golden cases: a Stream is fed
// the DiT's mel of every step (dit.mel [S, 12, 80], the reference's own values) and each
// step's voc.step{j}.mel_in (overlap + (mel+1)/2), decode, emit and tail are compared. m is
// the family's model.gguf (namespace vocos/ and the embedded config.json). Stages are
// recorded in r; the error is for what kept the checks from running.
func GoldenVocos(r *parity.Run, m *gguf.Model, backend engine.Backend) error {
	cfg := DefaultConfig()
	if raw, ok := m.EmbeddedFile("config.json"); ok {
		var err error
		if cfg, err = ParseConfig(raw); err != nil {
			return err
		}
	}
	voc, err := LoadConfig(m.Sub("vocos"), cfg, backend)
	if err != nil {
		return err
	}
	defer voc.Close()
	mel, shape, err := r.F32("dit.mel")
	if err != nil {
		return fmt.Errorf("vocos golden: %w", err)
	}
	if len(shape) != 3 || shape[2] != voc.Dims.Mels {
		return fmt.Errorf("vocos golden: dit.mel has shape %v, want [steps, frames, %d]", shape, voc.Dims.Mels)
	}
	s, err := voc.NewStream()
	if err != nil {
		return err
	}
	per := shape[1] * shape[2]
	for j := range shape[0] {
		name := func(stage string) string { return fmt.Sprintf("voc.step%d.%s", j, stage) }
		emit, err := s.Push(mel[j*per : (j+1)*per])
		if err != nil {
			for _, st := range []string{"mel_in", "decode", "emit", "tail"} {
				r.Fail(name(st), err)
			}
			continue
		}
		r.Check(name("mel_in"), s.window, goldenTol)
		r.Check(name("decode"), s.decoded, goldenTol)
		r.Check(name("emit"), emit, goldenTol)
		r.Check(name("tail"), s.tail, goldenTol)
	}
	return nil
}
