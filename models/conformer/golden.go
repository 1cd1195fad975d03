package conformer

import (
	"fmt"

	"github.com/voxpipe/voxpipe/engine"
	"github.com/voxpipe/voxpipe/engine/gguf"
	"github.com/voxpipe/voxpipe/internal/parity"
)

// goldenTol is the manifest's tolerance for the front end and the encoder stages (relative
// to the expected tensor's peak). The manifest allows 1e-3 for whole chains run from the
// audio, but the front end and encoder alone stay far inside the stage tolerance (about
// 5e-7), so the free-running chain is held to that too: a drift would show early.
const (
	goldenTol = 1e-4
	chainTol  = goldenTol
)

// GoldenASR checks the MeanVC2 front end and encoder (model m: the golden model.gguf) on the
// golden cases:
//
//   - asr.fbank_windows and asr.offsets from input.src_wav through Push/Flush, and again from
//     the chunk{i}.samples fed one reference chunk each (chunk.window_index);
//   - asr.bn and asr.w{w}.{att,cnn}_cache_after teacher-forced: window w gets the expected
//     window and offset and starts from the expected caches after window w−1 (zeros first);
//   - "chain:" stages: the encoder run free from input.src_wav (own windows, own caches),
//     against the same expected tensors.
func GoldenASR(r *parity.Run, m *gguf.Model, backend engine.Backend) {
	model, err := LoadGGUF(m, backend)
	if err != nil {
		r.Fail("asr.bn", err)
		return
	}
	defer model.Close()
	cfg := model.Config

	// Front end from the whole source, cut by Push.
	wav, _, err := r.F32("input.src_wav")
	if err != nil {
		r.Fail("asr.fbank_windows", err)
		return
	}
	fe, err := NewFrontEnd(cfg)
	if err != nil {
		r.Fail("asr.fbank_windows", err)
		return
	}
	var windows []float32
	var offsets []int32
	collect := func(w []float32, off int) error {
		windows = append(windows, w...)
		offsets = append(offsets, int32(off))
		return nil
	}
	if err := fe.Push(wav, collect); err == nil {
		err = fe.Flush(collect)
	}
	if err != nil {
		r.Fail("asr.fbank_windows", err)
		return
	}
	r.Check("asr.fbank_windows", windows, goldenTol)
	r.CheckI32("asr.offsets", offsets)

	// The driver's own chunks, one reference chunk each.
	fe.Reset()
	var chunked, joined []float32
	var index, count []int32
	for i := 0; r.Has(fmt.Sprintf("chunk%d.samples", i)); i++ {
		s, _, err := r.F32(fmt.Sprintf("chunk%d.samples", i))
		if err != nil {
			r.Fail("chunk.window_index", err)
			return
		}
		joined = append(joined, s...)
		first := int32(fe.Windows())
		n, err := fe.Chunk(s, func(w []float32, _ int) error {
			chunked = append(chunked, w...)
			return nil
		})
		if err != nil {
			r.Fail("chunk.window_index", err)
			return
		}
		if n == 0 {
			first = -1
		}
		index = append(index, first)
		count = append(count, int32(n))
	}
	r.CheckI32("chunk.window_index", index)
	if r.Has("chunk.window_count") { // the 40 ms model's cases: a chunk may hold two windows
		r.CheckI32("chunk.window_count", count)
	}
	r.Compare("chunk{i}.samples joined = input.src_wav", joined, wav[:min(len(joined), len(wav))], 0)
	wantWin, wshape, err := r.F32("asr.fbank_windows")
	if err != nil {
		r.Fail("asr.bn", err)
		return
	}
	r.Compare("asr.fbank_windows from chunk{i}.samples", chunked, wantWin, goldenTol)

	// Teacher-forced encoder.
	wantOff, err := r.I32("asr.offsets")
	if err != nil {
		r.Fail("asr.bn", err)
		return
	}
	nw := wshape[0]
	winLen := len(wantWin) / max(nw, 1)
	if len(wantOff) != nw {
		r.Fail("asr.bn", fmt.Errorf("%d offsets for %d windows", len(wantOff), nw))
		return
	}
	st, err := model.NewState()
	if err != nil {
		r.Fail("asr.bn", err)
		return
	}
	defer st.Close()
	var bn []float32
	for w := range nw {
		st.Reset()
		if w > 0 {
			for _, c := range []struct {
				name string
				dst  []float32
			}{{"att", st.AttCache()}, {"cnn", st.CNNCache()}} {
				prev, _, err := r.F32(fmt.Sprintf("asr.w%d.%s_cache_after", w-1, c.name))
				if err != nil || len(prev) != len(c.dst) {
					r.Fail("asr.bn", fmt.Errorf("window %d: %s cache of %d values for %d: %v", w, c.name, len(prev), len(c.dst), err))
					return
				}
				copy(c.dst, prev)
			}
		}
		out, err := st.Forward(wantWin[w*winLen:(w+1)*winLen], int(wantOff[w]))
		if err != nil {
			r.Fail("asr.bn", err)
			return
		}
		bn = append(bn, out...)
		r.Check(fmt.Sprintf("asr.w%d.att_cache_after", w), st.AttCache(), goldenTol)
		r.Check(fmt.Sprintf("asr.w%d.cnn_cache_after", w), st.CNNCache(), goldenTol)
	}
	r.Check("asr.bn", bn, goldenTol)

	// Free-running chain from the audio: the front end's windows, the State's own caches.
	st.Reset()
	wantBN, _, err := r.F32("asr.bn")
	if err != nil {
		r.Fail("asr.bn", err)
		return
	}
	bn = bn[:0]
	nOwn := min(len(offsets), nw)
	for w := range nOwn {
		out, err := st.Forward(windows[w*winLen:(w+1)*winLen], int(offsets[w]))
		if err != nil {
			r.Fail("chain: asr.bn", err)
			return
		}
		bn = append(bn, out...)
		if w == nOwn-1 {
			for _, c := range []struct {
				name string
				got  []float32
			}{{"att", st.AttCache()}, {"cnn", st.CNNCache()}} {
				name := fmt.Sprintf("asr.w%d.%s_cache_after", w, c.name)
				want, _, err := r.F32(name)
				if err != nil {
					r.Fail("chain: "+name, err)
					continue
				}
				r.Compare("chain: "+name, c.got, want, chainTol)
			}
		}
	}
	r.Compare("chain: asr.bn", bn, wantBN, chainTol)
}
