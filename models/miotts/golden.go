package miotts

import (
	"fmt"
	"strconv"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/internal/parity"
	"github.com/voxpipe/voxpipe/models/sampler"
)

// Golden checks every case of a MioTTS golden folder (tokenizer, prompt, LM forward, KV
// cache, greedy and sampled decoding) against the model in the same folder. The cases run
// with an F32 KV cache, the reference's precision; where the backend serves with an F16
// cache (the CPU), the greedy decode runs again with it, within the cache's rounding.
func Golden(r *parity.Run, backend engine.Backend) error {
	lm, err := LoadLM(r.ModelPath(), backend)
	if err != nil {
		return err
	}
	defer lm.Close()
	served := lm.Model.KVCache()
	if err := lm.Model.SetKVCache(engine.F32); err != nil {
		return err
	}
	goldenTokenizer(r, lm)
	prompt, err := r.I32("prompt.ids")
	if err != nil {
		return err
	}
	text, err := r.Cases.File.KV.String("prompt.user_text")
	if err != nil {
		return fmt.Errorf("golden miotts: %w", err)
	}
	r.CheckI32("prompt.ids", lm.Prompt(text))
	goldenPrefill(r, lm, prompt)
	goldenGreedy(r, lm, prompt, "", 1e-4)
	goldenSampled(r, lm, prompt)
	if served == engine.F16 {
		if err := lm.Model.SetKVCache(engine.F16); err != nil {
			return err
		}
		// Rounding each cached value to 11 significant bits moves the golden logits by
		// 5.5e-4 (relative): 2e-3 leaves room and still catches a wrong row or type.
		goldenGreedy(r, lm, prompt, "@kv_f16", 2e-3)
	}
	return nil
}

func goldenTokenizer(r *parity.Run, lm *LM) {
	for i := 0; ; i++ {
		base := fmt.Sprintf("tok.%02d.", i)
		if !r.Has(base + "ids") {
			return
		}
		text, err := r.Cases.File.KV.String(base + "text")
		if err != nil {
			r.Fail(base+"ids", err)
			continue
		}
		ids := lm.Tokenizer.Encode(text)
		got := make([]int32, len(ids))
		for j, v := range ids {
			got[j] = int32(v)
		}
		r.CheckI32(base+"ids", got)
		// ids_no_nfc documents what an engine without NFC would give; we normalise, so
		// our ids must match the NFC ones above and differ from these.
		if r.Has(base + "ids_no_nfc") {
			no, _ := r.I32(base + "ids_no_nfc")
			if equalI32(no, got) {
				r.Fail(base+"ids_no_nfc", fmt.Errorf("ids equal the un-normalised encoding: NFC not applied"))
			}
		}
	}
}

func equalI32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func goldenPrefill(r *parity.Run, lm *LM, prompt []int32) {
	c := lm.Model.Config
	sess, err := lm.Model.NewSession(len(prompt))
	if err != nil {
		r.Fail("lm.prefill.logits_full", err)
		return
	}
	defer sess.Close()
	sess.Trace(true)
	logits, err := sess.Prefill(prompt)
	if err != nil {
		r.Fail("lm.prefill.logits_full", err)
		return
	}
	r.Check("lm.prefill.embed", sess.Hidden("embed"), 1e-6)
	for i := range c.Layers {
		r.Check(fmt.Sprintf("lm.prefill.layer%d.out", i), sess.Hidden("layer"+strconv.Itoa(i)), 1e-4)
	}
	r.Check("lm.prefill.logits_full", logits, 1e-4)
	restricted := make([]float32, len(lm.rows))
	for i, row := range lm.rows {
		restricted[i] = logits[row]
	}
	r.Check("lm.prefill.logits_restricted", restricted, 1e-4)
	// Caches are [kv_head, position, head_dim] over the prompt positions.
	for i := range c.Layers {
		for _, kv := range []struct {
			name string
			buf  []float32
		}{{"k", sess.KCache(i)}, {"v", sess.VCache(i)}} {
			got := make([]float32, 0, c.KVHeads*len(prompt)*c.HeadDim)
			for h := range c.KVHeads {
				base := h * len(prompt) * c.HeadDim
				got = append(got, kv.buf[base:base+len(prompt)*c.HeadDim]...)
			}
			r.Check(fmt.Sprintf("lm.prefill.%s.layer%d", kv.name, i), got, 1e-4)
		}
	}
}

// goldenSteps replays a decode: at each step it records the restricted logits and feeds
// back the token next returns.
func goldenSteps(lm *LM, prompt []int32, steps int, next func(step int, logits []float32, history []int32) int32) ([]float32, error) {
	sess, err := lm.Model.NewSession(len(prompt) + steps)
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	if err := sess.SetOutputRows(lm.rows); err != nil {
		return nil, err
	}
	logits, err := sess.Prefill(prompt)
	if err != nil {
		return nil, err
	}
	var all []float32
	history := append([]int32{}, prompt...)
	for step := range steps {
		all = append(all, logits...)
		id := next(step, logits, history)
		history = append(history, id)
		if step < steps-1 {
			if logits, err = sess.Step(id); err != nil {
				return nil, err
			}
		}
	}
	return all, nil
}

// goldenGreedy checks the greedy ids and logits; suffix names the stages of a rerun with
// other settings, and tol is the logits' tolerance.
func goldenGreedy(r *parity.Run, lm *LM, prompt []int32, suffix string, tol float64) {
	want, err := r.I32("lm.greedy.ids")
	if err != nil {
		r.Fail("lm.greedy.ids"+suffix, err)
		return
	}
	wantLogits, _, err := r.F32("lm.greedy.logits")
	if err != nil {
		r.Fail("lm.greedy.logits"+suffix, err)
		return
	}
	smp := sampler.New(sampler.Config{Greedy: true})
	if err := smp.SetCandidates(lm.rows); err != nil {
		r.Fail("lm.greedy.ids"+suffix, err)
		return
	}
	// Teacher forcing: the expected token is fed back, so one early mismatch does not
	// hide how the later rows compare.
	var ids []int32
	logits, err := goldenSteps(lm, prompt, len(want), func(step int, l []float32, h []int32) int32 {
		ids = append(ids, smp.Sample(l, h))
		return want[step]
	})
	if err != nil {
		r.Fail("lm.greedy.ids"+suffix, err)
		return
	}
	r.Add(parity.CompareI32("lm.greedy.ids"+suffix, ids, want))
	r.Compare("lm.greedy.logits"+suffix, logits, wantLogits, tol)
}

func goldenSampled(r *parity.Run, lm *LM, prompt []int32) {
	kv := r.Cases.File.KV
	temp, err1 := kv.Float("lm.sample.temperature")
	topK, err2 := kv.Int("lm.sample.top_k")
	topP, err3 := kv.Float("lm.sample.top_p")
	rp, err4 := kv.Float("lm.sample.repetition_penalty")
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			r.Fail("lm.sample.ids", err)
			return
		}
	}
	want, err := r.I32("lm.sample.ids")
	if err != nil {
		r.Fail("lm.sample.ids", err)
		return
	}
	us, _, err := r.F32("lm.sample.uniforms")
	if err != nil || len(us) < len(want) {
		r.Fail("lm.sample.ids", fmt.Errorf("uniforms: %v (%d for %d steps)", err, len(us), len(want)))
		return
	}
	smp := sampler.New(sampler.Config{Temperature: asF32(temp), TopK: int(topK), TopP: asF32(topP), RepetitionPenalty: asF32(rp)})
	if err := smp.SetCandidates(lm.rows); err != nil {
		r.Fail("lm.sample.ids", err)
		return
	}
	var ids, kept []int32
	logits, err := goldenSteps(lm, prompt, len(want), func(step int, l []float32, h []int32) int32 {
		ids = append(ids, smp.SampleWithUniform(l, h, float64(us[step])))
		kept = append(kept, int32(smp.Kept()))
		return want[step]
	})
	if err != nil {
		r.Fail("lm.sample.ids", err)
		return
	}
	r.CheckI32("lm.sample.ids", ids)
	r.CheckI32("lm.sample.kept", kept)
	r.Check("lm.sample.logits", logits, 1e-4)
}

// asF32 undoes the float32 storage of a decimal setting (0.800000011920929 → 0.8).
func asF32(v float64) float64 {
	x, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', -1, 32), 64)
	return x
}
