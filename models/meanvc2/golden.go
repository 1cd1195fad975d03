package meanvc2

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/models/conformer"
	"github.com/voxpipe/voxpipe/models/ecapa"
	"github.com/voxpipe/voxpipe/models/vocos"
	"github.com/voxpipe/voxpipe/models/wavlm"
)

// Golden is the whole meanvc2 family check (`voxpipe golden --family meanvc2`): every
// component's stages on the golden cases (WavLM, ECAPA, front end and ASR, DiT, vocoder),
// then the end-to-end converter: the speaker path from input.ref_wav, and chunk{i}.samples
// through one Stream with the reference's noise draws (dit.raw_draw, through the stream's
// own carry) — each chunk's emitted audio, the emit lengths and output.wav. The stages are
// recorded in r; the error is for what kept the checks from running. Call r.Finish() after.
func Golden(r *parity.Run, backend engine.Backend) error {
	f, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		return fmt.Errorf("meanvc2 golden: %w", err)
	}
	defer f.Close()

	wavlm.GoldenMeanVC2(r, f.Sub("speaker_wavlm"), backend)
	if err := ecapa.GoldenECAPA(r, f, backend); err != nil {
		r.Fail("spk.ecapa", err)
	}
	conformer.GoldenASR(r, f, backend)
	GoldenDiT(r, f, backend)
	if err := vocos.GoldenVocos(r, f, backend); err != nil {
		r.Fail("voc", err)
	}

	m, err := LoadFromModel(f, backend)
	if err != nil {
		return fmt.Errorf("meanvc2 golden: %w", err)
	}
	defer m.Close()
	return goldenStream(r, m)
}

// goldenStream is the end-to-end part of Golden.
func goldenStream(r *parity.Run, m *Model) error {
	ref, _, err := r.F32("input.ref_wav")
	if err != nil {
		return fmt.Errorf("meanvc2 golden: %w", err)
	}
	spk, err := m.SpeakerEmbedding(ref, m.Config.Runtime.SampleRate)
	if err != nil {
		r.Fail("e2e: spk.embedding from input.ref_wav", err)
		return nil
	}
	if want, _, err := r.Cases.Get("spk.embedding"); err != nil {
		r.Fail("e2e: spk.embedding from input.ref_wav", err)
	} else {
		r.Compare("e2e: spk.embedding from input.ref_wav", spk, want, stageTol)
	}
	target, err := m.Timbre(spk)
	if err != nil {
		r.Fail("e2e: output.wav", err)
		return nil
	}

	c := m.Config
	raw, shape, err := r.F32("dit.raw_draw")
	if err != nil || len(shape) != 3 {
		return fmt.Errorf("meanvc2 golden: dit.raw_draw %v: %v", shape, err)
	}
	per := c.Window() * c.MelDim
	s, err := m.NewStream(target)
	if err != nil {
		return fmt.Errorf("meanvc2 golden: %w", err)
	}
	defer s.Close()
	s.SetNoise(func(j int) []float32 {
		if j < shape[0] {
			return raw[j*per : (j+1)*per]
		}
		return nil // more steps than the reference: Compare reports the lengths
	})

	var wav []float32
	var lens []int32
	for i := 0; r.Has(fmt.Sprintf("chunk%d.samples", i)); i++ {
		in, _, err := r.Cases.Get(fmt.Sprintf("chunk%d.samples", i)) // GoldenASR checks these
		if err != nil {
			return fmt.Errorf("meanvc2 golden: %w", err)
		}
		name := fmt.Sprintf("chunk%d.emit", i)
		var emit []float32
		if len(in) == s.ChunkSize() {
			emit, err = s.Process(nil, in)
		} else {
			emit, err = s.chunk(nil, in) // the file's last short chunk, as process_chunk runs it
		}
		if err != nil {
			r.Fail(name, err)
			r.Fail("output.wav", err)
			return nil
		}
		lens = append(lens, int32(len(emit)))
		wav = append(wav, emit...)
		if len(emit) == 0 && !r.Has(name) {
			continue // no step ran and the reference stored nothing
		}
		r.Check(name, emit, chainTol)
	}
	r.CheckI32("chunk.emit_len", lens)
	wav, err = s.Flush(wav)
	if err != nil {
		r.Fail("output.wav", err)
		return nil
	}
	r.Check("output.wav", wav, chainTol)
	return nil
}
