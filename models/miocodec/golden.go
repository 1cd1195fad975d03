package miocodec

import (
	"fmt"
	"math"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// Golden tolerances (relative to max |expected|; MANIFEST §5).
const (
	tolStage   = 1e-4
	tolContent = 1e-5
	tolInterp  = 1e-5
)

// GoldenDecode checks the token decoder, the interpolation, the windowed decoding
// mechanics and the encode path against the golden cases (decA.*, decB.*, decB_tal.*,
// interp.*, chunk.*, encode.*), recording a stage per comparison in r.
func GoldenDecode(r *parity.Run, m *gguf.Model, backend engine.Backend) {
	goldenAll(r, m, backend)
}

// goldenAll is GoldenDecode returning the windowed-decoding figures (nil when the decoder
// does not load).
func goldenAll(r *parity.Run, m *gguf.Model, backend engine.Backend) *ChunkReport {
	d, err := LoadDecoder(m, backend)
	if err != nil {
		r.Fail("decA.waveform", err)
		return nil
	}
	defer d.Close()
	goldenDec(r, d, "decA", 0)
	goldenDec(r, d, "decB", 0)
	goldenDecTAL(r, d)
	goldenInterp(r, d)
	rep := goldenChunks(r, d)
	e, err := LoadEncoder(m, backend)
	if err != nil {
		r.Fail("encode.token_indices", err)
		return rep
	}
	defer e.Close()
	goldenEncode(r, e)
	return rep
}

// goldenDec decodes case.tokens and checks every stage the case stores.
func goldenDec(r *parity.Run, d *Decoder, c string, tal int) {
	tokens, err := r.I32(c + ".tokens")
	if err != nil {
		r.Fail(c+".tokens", err)
		return
	}
	global, _, err := r.F32(c + ".global_embedding")
	if err != nil {
		r.Fail(c+".global_embedding", err)
		return
	}
	stages, wave, err := d.Stages(tokens, global, tal)
	if err != nil {
		r.Fail(c+".waveform", err)
		return
	}
	for _, name := range stageNames(len(d.Config.UpsamplerFactors)) {
		full := c + "." + name
		if !r.Has(full) {
			continue
		}
		tol := tolStage
		switch name {
		case "fsq_codes":
			tol = 0
		case "content_embedding":
			tol = tolContent
		}
		r.Check(full, stages[name], tol)
	}
	r.Check(c+".waveform", wave, tolStage)
}

func goldenDecTAL(r *parity.Run, d *Decoder) {
	tokens, err1 := r.I32("decB.tokens")
	global, _, err2 := r.F32("decB.global_embedding")
	tal, err3 := r.I32("decB_tal.target_audio_length")
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			r.Fail("decB_tal.waveform", err)
			return
		}
	}
	wave, err := d.DecodeLength(tokens, global, int(tal[0]))
	if err != nil {
		r.Fail("decB_tal.waveform", err)
		return
	}
	r.Check("decB_tal.waveform", wave, tolStage)
}

// goldenInterp checks the interpolation op alone on the stored input.
func goldenInterp(r *parity.Run, d *Decoder) {
	in, shape, err := r.F32("interp.input")
	if err != nil {
		r.Fail("interp.input", err)
		return
	}
	for _, name := range r.Names("interp.out_") {
		var n int
		if _, err := fmt.Sscanf(name, "interp.out_%d", &n); err != nil {
			r.Fail(name, err)
			continue
		}
		got, err := interpolate(d.backend, in, shape[0], shape[1], n)
		if err != nil {
			r.Fail(name, err)
			continue
		}
		r.Check(name, got, tolInterp)
	}
}

// interpolate runs the decoder's interpolation (linear, align_corners=False) on a
// time-major (T, C) input to n frames.
func interpolate(be engine.Backend, x []float32, T, C, n int) ([]float32, error) {
	g := engine.NewGraph("miocodec.interp")
	in := g.Input("x", engine.F32, int64(T), int64(C))
	y := g.InterpLinear(g.Reshape(g.Transpose(in, 0, 1), 1, int64(C), int64(T)), int64(n))
	g.Output("y", g.Transpose(g.Reshape(y, int64(C), int64(n)), 0, 1))
	prog, err := be.Compile(g)
	if err != nil {
		return nil, err
	}
	defer prog.Close()
	copy(prog.Input("x"), x)
	if err := prog.Run(); err != nil {
		return nil, err
	}
	return append([]float32(nil), prog.Output("y")...), nil
}

// relDiff is max|a − b|/max|b| and rms(a − b)/rms(b).
func relDiff(a, b []float32) (maxRel, rmsRel float64) {
	var md, mb, sd, sb float64
	for i := range b {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		md = max(md, d)
		mb = max(mb, math.Abs(float64(b[i])))
		sd += d * d
		sb += float64(b[i]) * float64(b[i])
	}
	if mb == 0 || sb == 0 {
		return md, math.Sqrt(sd)
	}
	return md / mb, math.Sqrt(sd / sb)
}

// streamDecode decodes all of tokens through a Stream (all tokens pushed at once, then
// flushed).
func streamDecode(d *Decoder, tokens []int32, global []float32, o StreamOptions) ([]float32, error) {
	s, err := d.NewStream(global, o)
	if err != nil {
		return nil, err
	}
	a, err := s.Push(tokens)
	if err != nil {
		return nil, err
	}
	out := append([]float32(nil), a...)
	b, err := s.Flush()
	if err != nil {
		return nil, err
	}
	return append(out, b...), nil
}

// ctxOption is a context size as a StreamOptions value (0 tokens is "none").
func ctxOption(c int) int {
	if c == 0 {
		return -1
	}
	return c
}

// SweepPoint is stitched windowed decoding against the offline decode at one context.
type SweepPoint struct {
	Context        int
	MaxAbs         float64 // max |stitched − offline|
	MaxRel, RMSRel float64 // relative to max |offline| and rms(offline)
}

// ContextSweep decodes tokens in windows of core tokens with ctx tokens of context on each
// side (no crossfade, as the golden procedure) under a statistics mode and compares the
// stitched output with full, the offline decode.
func ContextSweep(d *Decoder, tokens []int32, global, full []float32, core int, ctxs []int, mode StatsMode, frozen *GroupStats) ([]SweepPoint, error) {
	var out []SweepPoint
	for _, c := range ctxs {
		o := StreamOptions{Core: core, LeftContext: ctxOption(c), RightContext: ctxOption(c), Crossfade: -1, Stats: mode, Frozen: frozen}
		got, err := streamDecode(d, tokens, global, o)
		if err != nil {
			return out, err
		}
		if len(got) != len(full) {
			return out, fmt.Errorf("miocodec: context %d: %d samples, want %d", c, len(got), len(full))
		}
		st := parity.Compare("", got, full, 0)
		_, rr := relDiff(got, full)
		out = append(out, SweepPoint{Context: c, MaxAbs: st.MaxAbs, MaxRel: st.Rel, RMSRel: rr})
	}
	return out, nil
}

// ChunkReport holds the windowed-decoding figures GoldenDecode measures (documentation
// next to the reference's chunk.core_maxdiff, err_profile and sweep_* tensors).
type ChunkReport struct {
	CoreMaxDiff   []float64    // per chunk.windows window: max |core − full decode|
	Plain, Frozen []SweepPoint // chunk.long_tokens sweep, plain and full-utterance statistics
}

// goldenChunks checks the windowed mechanics (each chunk.windows window decoded alone
// reproduces chunk.win*.waveform), stitched decoding with frozen full-utterance statistics
// (context ≥ 96) against the reference's documented deviation, and measures the
// documentation figures.
func goldenChunks(r *parity.Run, d *Decoder) *ChunkReport {
	rep := &ChunkReport{}
	tokens, err1 := r.I32("decA.tokens")
	global, _, err2 := r.F32("decA.global_embedding")
	wins, err3 := r.I32("chunk.windows")
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			r.Fail("chunk.windows", err)
			return rep
		}
	}
	full, err := d.Decode(tokens, global)
	if err != nil {
		r.Fail("chunk.windows", err)
		return rep
	}
	spt := d.Config.SamplesPerToken()
	for i := 0; i+3 < len(wins); i += 4 {
		start, end, c0, c1 := int(wins[i]), int(wins[i+1]), int(wins[i+2]), int(wins[i+3])
		name := fmt.Sprintf("chunk.win%d.waveform", i/4)
		if start < 0 || end > len(tokens) || start > c0 || c0 >= c1 || c1 > end {
			r.Fail(name, fmt.Errorf("bad window %d..%d core %d..%d", start, end, c0, c1))
			continue
		}
		w, err := d.Decode(tokens[start:end], global)
		if err != nil {
			r.Fail(name, err)
			continue
		}
		r.Check(name, w, tolStage)
		var md float64
		for j := (c0 - start) * spt; j < (c1-start)*spt; j++ {
			md = max(md, math.Abs(float64(w[j])-float64(full[start*spt+j])))
		}
		rep.CoreMaxDiff = append(rep.CoreMaxDiff, md)
	}
	r.Use("chunk.core_maxdiff", "chunk.err_profile")

	long, err1 := r.I32("chunk.long_tokens")
	ctxs, err2 := r.I32("chunk.sweep_ctx")
	if err1 != nil || err2 != nil {
		r.Fail("chunk.long_tokens", fmt.Errorf("%v %v", err1, err2))
		return rep
	}
	fullLong, stats, err := d.DecodeStats(long, global)
	if err != nil {
		r.Fail("chunk.long_tokens", err)
		return rep
	}
	cs := make([]int, len(ctxs))
	for i, c := range ctxs {
		cs[i] = int(c)
	}
	const core = 24
	if rep.Plain, err = ContextSweep(d, long, global, fullLong, core, cs, StatsPlain, nil); err != nil {
		r.Fail("chunk.sweep_rel_maxdiff", err)
	}
	if rep.Frozen, err = ContextSweep(d, long, global, fullLong, core, cs, StatsFrozen, stats); err != nil {
		r.Fail("chunk.sweep_rel_maxdiff_gnfrozen", err)
	}
	r.Use("chunk.sweep_rel_maxdiff", "chunk.sweep_rel_rmsdiff", "chunk.sweep_rel_rmsdiff_gnfrozen")
	// §6b.2: with full-utterance statistics and context ≥ 96, stitched decoding matches the
	// offline decode as chunk.sweep_rel_maxdiff_gnfrozen shows for the reference.
	doc, _, err := r.F32("chunk.sweep_rel_maxdiff_gnfrozen")
	if err == nil && len(doc) != len(cs) {
		err = fmt.Errorf("%d documented values for %d contexts", len(doc), len(cs))
	}
	if err != nil {
		r.Fail("chunk.sweep_rel_maxdiff_gnfrozen", err)
		return rep
	}
	for i, p := range rep.Frozen { // in chunk.sweep_ctx order, as doc
		if p.Context >= frozenMinContext {
			r.Add(frozenStage(p, float64(doc[i])))
		}
	}
	return rep
}

// frozenMinContext is the context from which the manifest states stitched decoding with
// frozen statistics matches the offline decode (§6b.2).
const frozenMinContext = 96

// sweepMargin is how far above the reference's documented deviation ours may lie. That
// deviation is a float32 result which summation order moves by about a percent (3.27e-5
// against the reference's 3.24e-5 at context 96 here; 4.106e-3 against 4.10e-3 on a decoder
// whose receptive field is wider than 96 tokens), so 5 % is a small margin.
const sweepMargin = 0.05

// frozenStage checks one frozen-statistics sweep point against the reference's documented
// max relative deviation at that context: the manifest's 1e-4 where the context covers the
// decoder's receptive field (the reference's value is float noise there), and the
// reference's own deviation, with sweepMargin, where it does not.
func frozenStage(p SweepPoint, documented float64) parity.Stage {
	return parity.Stage{
		Name:   fmt.Sprintf("chunk.long_tokens.gnfrozen_ctx%d", p.Context),
		MaxAbs: p.MaxAbs,
		Rel:    p.MaxRel,
		Tol:    max(tolStage, documented*(1+sweepMargin)),
	}
}

// goldenEncode runs the encode path from the golden WavLM layers (tiny: local layers 1, 2).
func goldenEncode(r *parity.Run, e *Encoder) {
	var layers [][]float32
	T := 0
	for _, l := range e.Config.LocalSSLLayers {
		x, shape, err := r.F32(fmt.Sprintf("global.wavlm_layer%d", l))
		if err != nil {
			r.Fail("encode.local_ssl_norm", fmt.Errorf("local SSL layer %d: %w", l, err))
			return
		}
		layers, T = append(layers, x), shape[0]
	}
	enc, err := e.Encode(layers, T)
	if err != nil {
		r.Fail("encode.token_indices", err)
		return
	}
	for _, s := range []string{"local_ssl_norm", "local_encoder_out", "downsampled", "fsq_latent"} {
		r.Check("encode."+s, enc.Stages[s], tolStage)
	}
	r.CheckI32("encode.token_indices", enc.Tokens)
	r.Check("encode.content_embedding", enc.Content, tolStage)
}

// Golden checks every case of a MioCodec golden folder (token decode, windows, encode and
// the speaker path) against the model in the same folder.
func Golden(r *parity.Run, backend engine.Backend) error {
	m, err := gguf.OpenModel(r.ModelPath())
	if err != nil {
		return err
	}
	defer m.Close()
	GoldenDecode(r, m, backend)
	GoldenGlobal(r, m, backend)
	return nil
}
