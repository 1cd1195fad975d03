package meanvc2

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// Golden tolerances (MANIFEST §5): per stage when fed the expected inputs, and for the whole
// free-running chain.
const (
	stageTol = 1e-4
	chainTol = 1e-3
)

// GoldenDiT checks the conversion core against the meanvc2 golden cases: the GTM, the BN
// upsampling of every chunk (from asr.bn), the condition queue with its flush padding, the
// noise carry (dit.raw_draw → dit.noise), and every DiT step teacher-forced (dit.cond,
// dit.noise and the previous step's KV fed from the cases): velocities, x_mid, mel, the KV
// caches and the per-call details. A free-running chain over all steps (own GTM, own
// conditions, own caches, noise from dit.raw_draw) is recorded under "free.*" names.
// Inputs owned by other stages (spk.embedding, asr.bn, chunk.window_index) are read
// without being marked as checked.
func GoldenDiT(r *parity.Run, m *gguf.Model, backend engine.Backend) {
	fail := func(name string, err error) { r.Fail(name, fmt.Errorf("meanvc2: %w", err)) }
	d, err := LoadDiTFromModel(m, backend)
	if err != nil {
		fail("dit.load", err)
		return
	}
	defer d.Close()
	c := d.Config
	W, mel := c.Window(), c.MelDim

	spk, _, err := r.Cases.Get("spk.embedding")
	if err != nil {
		fail("gtm.k", err)
		return
	}
	timbre, err := d.Timbre(spk)
	if err != nil {
		fail("gtm.k", err)
		return
	}
	r.Check("gtm.k", timbre.K, stageTol)
	r.Check("gtm.v", timbre.V, stageTol)
	// Teacher forcing feeds the reference's memory, not ours.
	gk, _, err1 := r.F32("gtm.k")
	gv, _, err2 := r.F32("gtm.v")
	if err1 != nil || err2 != nil {
		fail("gtm.k", fmt.Errorf("reading the expected memory: %v %v", err1, err2))
		return
	}
	tfTimbre := Timbre{Spk: spk, K: gk, V: gv}

	// Conditions: chunk{i}.cond16 from asr.bn, then the queue with the end-of-file flush.
	bn, bnShape, err := r.Cases.Get("asr.bn")
	if err != nil || len(bnShape) != 3 {
		fail("chunk.cond16", fmt.Errorf("asr.bn: %v (shape %v)", err, bnShape))
		return
	}
	winIdx, _, err := r.Cases.GetInt32("chunk.window_index")
	if err != nil {
		fail("chunk.cond16", err)
		return
	}
	winCount := make([]int32, len(winIdx)) // the 120 ms cases have one window per chunk
	for i, w := range winIdx {
		if w >= 0 {
			winCount[i] = 1
		}
	}
	if r.Has("chunk.window_count") {
		if winCount, _, err = r.Cases.GetInt32("chunk.window_count"); err != nil || len(winCount) != len(winIdx) {
			fail("chunk.cond16", fmt.Errorf("chunk.window_count %v for %d chunks: %v", winCount, len(winIdx), err))
			return
		}
	}
	perWin := bnShape[1] * bnShape[2]
	var prev []float32
	queue := c.NewCondBuffer()
	var conds [][]float32
	maxSteps := c.Runtime.MaxDiTStepsPerChunk
	if maxSteps <= 0 {
		maxSteps = 4
	}
	for i, w := range winIdx {
		name := fmt.Sprintf("chunk%d.cond16", i)
		if w < 0 || winCount[i] == 0 {
			if r.Has(name) {
				r.Fail(name, fmt.Errorf("the case exists but chunk %d ran no ASR window", i))
			}
			continue
		}
		frames := bn[int(w)*perWin : int(w+winCount[i])*perWin] // the chunk's windows, in order
		cond16 := UpsampleBN(prev, frames, bnShape[2], c.Runtime.VCChunkFrames)
		prev = frames[len(frames)-bnShape[2]:]
		r.Check(name, cond16, stageTol)
		queue.Push(cond16)
		for range maxSteps {
			cnd, ok := queue.Next()
			if !ok {
				break
			}
			conds = append(conds, cnd)
		}
	}
	conds = append(conds, queue.Flush()...)
	r.Check("dit.cond", flat(conds), stageTol)

	// Schedule.
	var ts, rs []float32
	for range conds {
		for _, p := range c.Timesteps {
			ts, rs = append(ts, float32(p[0])), append(rs, float32(p[1]))
		}
	}
	r.Check("dit.t", ts, 0)
	r.Check("dit.r", rs, 0)

	wantCond, _, _ := r.F32("dit.cond")
	noise, _, err1 := r.F32("dit.noise")
	raw, _, err2 := r.F32("dit.raw_draw")
	offsets, err3 := r.I32("dit.offsets")
	if err1 != nil || err2 != nil || err3 != nil {
		fail("dit.noise", fmt.Errorf("reading the step inputs: %v %v %v", err1, err2, err3))
		return
	}
	steps := len(offsets)
	nDetail := steps
	if v, err := r.Cases.File.KV.Int("golden.n_detail_steps"); err == nil {
		nDetail = int(v)
	}
	if len(wantCond) != steps*W*c.BNDim || len(noise) != steps*W*mel || len(raw) != len(noise) {
		fail("dit.noise", fmt.Errorf("%d steps but cond/noise/raw_draw of %d/%d/%d values", steps, len(wantCond), len(noise), len(raw)))
		return
	}
	frame := func(a []float32, j, n int) []float32 { return a[j*n : (j+1)*n] }

	// Teacher-forced steps.
	st := d.NewState()
	defer st.Close()
	st.SetTrace(true)
	var us, xmid, mels []float32
	for j := range steps {
		if j > 0 {
			for l := range c.Depth {
				if err := loadKV(r, st, fmt.Sprintf("dit.step%d.kv%d", j-1, l), l); err != nil {
					fail(fmt.Sprintf("dit.step%d.kv%d.k", j-1, l), err)
					return
				}
			}
		}
		st.SetOffset(int(offsets[j]))
		out, err := st.Denoise(frame(noise, j, W*mel), frame(wantCond, j, W*c.BNDim), tfTimbre)
		if err != nil {
			fail(fmt.Sprintf("dit.step%d", j), err)
			return
		}
		tr := st.LastStep()
		for _, call := range tr.Calls {
			us = append(us, call.U...)
		}
		xmid = append(xmid, tr.X[0]...)
		mels = append(mels, out...)
		for l := range c.Depth {
			k, v, _, err := st.KV(l)
			if err != nil {
				fail(fmt.Sprintf("dit.step%d.kv%d.k", j, l), err)
				continue
			}
			r.Check(fmt.Sprintf("dit.step%d.kv%d.k", j, l), k, stageTol)
			r.Check(fmt.Sprintf("dit.step%d.kv%d.v", j, l), v, stageTol)
		}
		if j < nDetail {
			for ci, call := range tr.Calls {
				p := fmt.Sprintf("dit.step%d.e%d.", j, ci)
				r.Check(p+"t_time_embed", call.TEmb, stageTol)
				r.Check(p+"r_time_embed", call.REmb, stageTol)
				r.Check(p+"temporal_timbre", call.Timbre, stageTol)
				r.Check(p+"input_embed", call.InputEmbed, stageTol)
				for l, b := range call.Blocks {
					r.Check(fmt.Sprintf("%sblock%d", p, l), b, stageTol)
				}
				r.Check(p+"norm_out", call.NormOut, stageTol)
				r.Check(p+"proj_out", call.U, stageTol)
			}
		}
	}
	r.Check("dit.u", us, stageTol)
	r.Check("dit.x_mid", xmid, stageTol)
	r.Check("dit.mel", mels, stageTol)

	// Free-running chain: our GTM, our conditions, our caches; noise from the raw draws
	// through our carry.
	free := d.NewState()
	defer free.Close()
	var gotNoise, fMels, fU []float32
	var gotOffsets []int32
	for j, cnd := range conds {
		if j >= steps {
			break
		}
		x, err := free.Noise(frame(raw, j, W*mel))
		if err != nil {
			fail("free.dit.mel", err)
			return
		}
		gotNoise = append(gotNoise, x...)
		out, err := free.Denoise(x, cnd, timbre)
		if err != nil {
			fail("free.dit.mel", err)
			return
		}
		fMels = append(fMels, out...)
		gotOffsets = append(gotOffsets, int32(free.LastStep().Offset))
		for _, call := range free.LastStep().Calls {
			fU = append(fU, call.U...)
		}
	}
	r.CheckI32("dit.offsets", gotOffsets)
	r.Compare("dit.noise (carry of dit.raw_draw)", gotNoise, noise, 0)
	mark := func(name string, got []float32) {
		want, _, err := r.Cases.Get(name)
		if err != nil {
			fail("free."+name, err)
			return
		}
		r.Compare("free."+name, got, want, chainTol)
	}
	mark("dit.u", fU)
	mark("dit.mel", fMels)
	r.Use("dit.raw_draw")
}

// loadKV feeds the expected cache name.k/.v [H, n, Dh] into layer l.
func loadKV(r *parity.Run, st *State, name string, l int) error {
	k, shape, err := r.Cases.Get(name + ".k")
	if err != nil {
		return err
	}
	v, _, err := r.Cases.Get(name + ".v")
	if err != nil {
		return err
	}
	if len(shape) != 3 {
		return fmt.Errorf("%s.k has shape %v", name, shape)
	}
	return st.SetKV(l, k, v, shape[1])
}

func flat(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}
