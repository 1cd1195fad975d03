package miocodec

import (
	"runtime"
	"strings"
	"testing"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/internal/parity/paritytest"
)

// testThreads keeps the shared machine usable.
func testThreads() int { return min(2, runtime.NumCPU()) }

func loadTestDecoder(t testing.TB) (*parity.Run, *Decoder) {
	t.Helper()
	be, err := engine.NewCPU(testThreads())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return loadTestDecoderOn(t, be)
}

// loadTestDecoderOn loads the golden decoder on be.
func loadTestDecoderOn(t testing.TB, be engine.Backend) (*parity.Run, *Decoder) {
	t.Helper()
	r := paritytest.Open(t, "miocodec")
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	d, err := LoadDecoder(m, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return r, d
}

// TestDecodeGolden runs every check of GoldenDecode: all decoder stages, interpolation,
// windowed mechanics, frozen-statistics exactness and the encode path; it logs the
// windowed-decoding figures next to the reference's (MANIFEST §6).
func TestDecodeGolden(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	be, err := engine.NewCPU(testThreads())
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rep := goldenAll(r, m, be)
	paritytest.Require(t, r.Stages())
	// Every case is read except the speaker path's (global.*, checked with the global encoder).
	for _, s := range r.Finish() {
		if s.Err != "" && strings.HasPrefix(s.Name, "global.") {
			continue
		}
		if !s.OK() {
			t.Errorf("after Finish: %s", s)
		}
	}
	if rep == nil {
		return
	}
	t.Logf("chunk.windows core max|window − full| (plain): %.3g", rep.CoreMaxDiff)
	for i := range min(len(rep.Plain), len(rep.Frozen)) {
		p, f := rep.Plain[i], rep.Frozen[i]
		t.Logf("context %3d: plain max rel %.3g rms rel %.3g | GroupNorm frozen max rel %.3g rms rel %.3g",
			p.Context, p.MaxRel, p.RMSRel, f.MaxRel, f.RMSRel)
	}
}

// TestDecodeBlockedAttention: the query-blocked windowed attention of long sequences gives
// the same waveform as one masked attention over the whole sequence.
func TestDecodeBlockedAttention(t *testing.T) {
	r, d := loadTestDecoder(t)
	long, err := r.I32("chunk.long_tokens")
	if err != nil {
		t.Fatal(err)
	}
	global, _, err := r.F32("decA.global_embedding")
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := d.Decode(long, global)
	if err != nil {
		t.Fatal(err)
	}
	defer func(b int64) { attnBlock = b }(attnBlock)
	attnBlock = 0
	d.cache.Close() // rebuild the programs unblocked
	whole, err := d.Decode(long, global)
	if err != nil {
		t.Fatal(err)
	}
	mr, _ := relDiff(blocked, whole)
	t.Logf("blocked vs whole-sequence attention, %d tokens: max rel %.3g", len(long), mr)
	if mr > 1e-5 {
		t.Errorf("max rel diff %.3g", mr)
	}
}

func TestEncodeGolden(t *testing.T) {
	r := paritytest.Open(t, "miocodec")
	be, err := engine.NewCPU(testThreads())
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := LoadEncoder(m, be)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	goldenEncode(r, e)
	paritytest.Require(t, r.Stages())
	if _, err := e.Encode([][]float32{make([]float32, 64*10)}, 10); err == nil {
		t.Errorf("one SSL layer where %d are needed: no error", len(e.Config.LocalSSLLayers))
	}
}
