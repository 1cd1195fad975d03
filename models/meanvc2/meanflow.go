package meanvc2

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/voxpipe/voxpipe/engine"
)

// DefaultSeed seeds a State's noise generator (audio.cpp's default `seed` option).
const DefaultSeed = 42

// State is one stream of the DiT: per-layer rolling K/V caches (a few kilobytes a layer,
// handed to the step program with each call, so one program serves any states batched
// together), the frame offset and the noise carried between steps. The DiT's weights and
// programs are shared. A State is used by one goroutine at a time.
type State struct {
	d      *DiT
	err    error       // set once closed, reported by every call
	kc, vc [][]float32 // per layer [Heads, cap, DimHead], the valid rows at the end
	valid  []int       // valid (newest) rows per layer cache
	offset int
	carry  []float32 // the last BlockSize noise rows of the previous step
	hasCar bool
	seed   uint64
	rng    *rand.Rand
	trace  bool
	last   StepTrace
	x, raw []float32
	xw     []float32 // the mean-flow x
}

// CallTrace is one DiT call of a step. TEmb..NormOut are filled only with SetTrace(true).
type CallTrace struct {
	T, R       float64
	TEmb, REmb []float32 // [Dim] each time MLP's output
	Timbre     []float32 // [W, BNDim] TVT output
	InputEmbed []float32 // [W, Dim]
	Blocks     [][]float32
	NormOut    []float32 // [W, Dim]
	U          []float32 // [W, MelDim] predicted average velocity
}

// StepTrace is what the last Step did: its offset, x at the first call, each call's trace,
// x after each Euler update, and the emitted mel frames.
type StepTrace struct {
	Offset int
	X0     []float32
	Calls  []CallTrace
	X      [][]float32
	Mel    []float32
}

// NewState makes a stream with empty caches, offset 0 and the noise generator seeded with
// DefaultSeed. An allocation failure is reported by the first call that needs the caches.
func (d *DiT) NewState() *State {
	c := d.Config
	s := &State{d: d, valid: make([]int, c.Depth)}
	for l := range c.Depth {
		n := c.Heads * c.CacheFrames(l) * c.DimHead
		s.kc, s.vc = append(s.kc, make([]float32, n)), append(s.vc, make([]float32, n))
	}
	s.Seed(DefaultSeed)
	return s
}

// Seed restarts the noise generator (Go's PCG with normal draws; the reference's torch
// stream is not reproduced — inject noise for bit-parity).
func (s *State) Seed(seed uint64) {
	s.seed = seed
	s.rng = rand.New(rand.NewPCG(seed, 0x6d65616e76633221))
}

// Reset starts a new stream: empty caches, offset 0, no noise carry, generator re-seeded.
func (s *State) Reset() {
	clear(s.valid)
	s.offset = 0
	s.hasCar = false
	s.Seed(s.seed)
}

// Close drops the caches; every later call fails.
func (s *State) Close() {
	s.kc, s.vc = nil, nil
	if s.err == nil {
		s.err = fmt.Errorf("meanvc2: state is closed")
	}
}

// Offset is the frame offset of the next step (RoPE positions start there).
func (s *State) Offset() int { return s.offset }

// SetOffset sets the next step's frame offset (teacher-forced tests).
func (s *State) SetOffset(off int) { s.offset = off }

// SetTrace makes the following steps record every intermediate stage (LastStep).
func (s *State) SetTrace(on bool) { s.trace = on }

// LastStep is the trace of the last step (shared; valid until the next step).
func (s *State) LastStep() *StepTrace { return &s.last }

// KV returns copies of layer l's valid cache rows, k and v [Heads, n, DimHead] (keys after
// RMSNorm, before RoPE).
func (s *State) KV(l int) (k, v []float32, n int, err error) {
	if s.err != nil {
		return nil, nil, 0, s.err
	}
	if l < 0 || l >= len(s.kc) {
		return nil, nil, 0, fmt.Errorf("meanvc2: no layer %d", l)
	}
	c := s.d.Config
	n, capL, dh := s.valid[l], c.CacheFrames(l), c.DimHead
	read := func(all []float32) []float32 {
		out := make([]float32, 0, c.Heads*n*dh)
		for h := range c.Heads {
			out = append(out, all[(h*capL+capL-n)*dh:(h+1)*capL*dh]...)
		}
		return out
	}
	return read(s.kc[l]), read(s.vc[l]), n, nil
}

// SetKV replaces layer l's cache with n rows k, v [Heads, n, DimHead] (teacher forcing).
func (s *State) SetKV(l int, k, v []float32, n int) error {
	if s.err != nil {
		return s.err
	}
	c := s.d.Config
	if l < 0 || l >= len(s.kc) {
		return fmt.Errorf("meanvc2: no layer %d", l)
	}
	capL, dh := c.CacheFrames(l), c.DimHead
	if n < 0 || n > capL || len(k) != c.Heads*n*dh || len(v) != len(k) {
		return fmt.Errorf("meanvc2: layer %d cache: %d rows (%d/%d values) for capacity %d", l, n, len(k), len(v), capL)
	}
	write := func(all, src []float32) {
		clear(all)
		for h := range c.Heads {
			copy(all[(h*capL+capL-n)*dh:(h+1)*capL*dh], src[h*n*dh:(h+1)*n*dh])
		}
	}
	write(s.kc[l], k)
	write(s.vc[l], v)
	s.valid[l] = n
	return nil
}

// Noise turns a raw normal draw [Window, MelDim] (nil: draw one from the generator) into
// the step's starting x: rows 0..BlockSize−1 become the previous step's last BlockSize
// rows (the lookahead frames are denoised again from the same noise), and this step's last
// BlockSize rows are kept for the next. The result is shared until the next call.
func (s *State) Noise(raw []float32) ([]float32, error) {
	c := s.d.Config
	n := c.Window() * c.MelDim
	if raw == nil {
		if len(s.raw) != n {
			s.raw = make([]float32, n)
		}
		for i := range s.raw {
			s.raw[i] = float32(s.rng.NormFloat64())
		}
		raw = s.raw
	}
	if len(raw) != n {
		return nil, fmt.Errorf("meanvc2: noise of %d values, want %d×%d", len(raw), c.Window(), c.MelDim)
	}
	if len(s.x) != n {
		s.x = make([]float32, n)
	}
	copy(s.x, raw)
	b := c.BlockSize * c.MelDim
	if s.hasCar {
		copy(s.x[:b], s.carry)
	}
	s.carry = append(s.carry[:0], s.x[n-b:]...)
	s.hasCar = true
	return s.x, nil
}

// Step converts one window: cond16 [Window, BNDim] content features (chunk + lookahead),
// the target voice, and a raw noise draw (nil: drawn from the seeded generator; the carry
// is applied either way). It returns the ChunkSize mel frames [ChunkSize, MelDim] in
// [−1, 1] (owned by the State, valid until its next step) and advances the offset by
// ChunkSize.
func (s *State) Step(cond16 []float32, timbre Timbre, noise []float32) ([]float32, error) {
	x, err := s.Noise(noise)
	if err != nil {
		return nil, err
	}
	return s.Denoise(x, cond16, timbre)
}

// Denoise runs the mean-flow sampler from an exact starting x [Window, MelDim] (no noise carry is
// applied or updated): one DiT call per (t, r) of the schedule, x ← x − (t−r)·u, all calls
// on the caches as they were before the step, the last call committing its chunk rows.
// The mel frames are owned by the State until its next step.
func (s *State) Denoise(x0, cond []float32, timbre Timbre) ([]float32, error) {
	mel, err := s.d.DenoiseBatch([]*State{s}, [][]float32{x0}, [][]float32{cond}, []Timbre{timbre})
	if err != nil {
		return nil, err
	}
	return mel[0], nil
}

// maxStepPrograms bounds the step programs a DiT keeps: a commit and a non-commit one per
// batch size in use.
const maxStepPrograms = 2 * MaxBatch

// MaxBatch is the most streams one batched program runs; more are run in several batches.
const MaxBatch = 16

// DenoiseBatch is Denoise for several states at once (distinct, at most MaxBatch): every
// DiT call of the step runs all of them as one program, and each state's mel frames, caches
// and offset come out bit for bit as if it ran alone. A state with tracing on runs alone.
// Nothing is changed when an argument is refused.
func (d *DiT) DenoiseBatch(states []*State, x0s, conds [][]float32, timbres []Timbre) ([][]float32, error) {
	c := d.Config
	W, B := c.Window(), len(states)
	if B == 0 || B > MaxBatch || len(x0s) != B || len(conds) != B || len(timbres) != B {
		return nil, fmt.Errorf("meanvc2: step: %d states (at most %d) with %d/%d/%d inputs", B, MaxBatch, len(x0s), len(conds), len(timbres))
	}
	for b, s := range states {
		x0, cond, timbre := x0s[b], conds[b], timbres[b]
		switch {
		case s.err != nil:
			return nil, s.err
		case s.d != d:
			return nil, fmt.Errorf("meanvc2: step: a state of another model")
		case slices.Index(states, s) != b:
			return nil, fmt.Errorf("meanvc2: step: a state twice in one batch")
		case s.trace && B > 1:
			return nil, fmt.Errorf("meanvc2: step: a traced state runs alone")
		case len(x0) != W*c.MelDim:
			return nil, fmt.Errorf("meanvc2: step: x of %d values, want %d×%d", len(x0), W, c.MelDim)
		case len(cond) != W*c.BNDim:
			return nil, fmt.Errorf("meanvc2: step: cond of %d values, want %d×%d", len(cond), W, c.BNDim)
		case len(timbre.Spk) != c.SpkDim || len(timbre.K) != c.GTMSlots*c.GTMHidden || len(timbre.V) != len(timbre.K):
			return nil, fmt.Errorf("meanvc2: step: timbre of %d/%d/%d values, want %d and %d×%d", len(timbre.Spk), len(timbre.K), len(timbre.V), c.SpkDim, c.GTMSlots, c.GTMHidden)
		}
	}
	trace := states[0].trace
	for b, s := range states {
		if s.offset >= c.OffsetReset {
			// The reference restarts the offset and drops the caches here (every ~40 s).
			s.offset = 0
			clear(s.valid)
		}
		tr := &s.last
		tr.Offset = s.offset
		tr.X0 = append(tr.X0[:0], x0s[b]...)
		// The trace's buffers are reused from step to step: no per-step allocation unless
		// tracing.
		if n := len(c.Timesteps); len(tr.Calls) != n {
			tr.Calls, tr.X = make([]CallTrace, n), make([][]float32, n)
		}
		s.xw = append(s.xw[:0], x0s[b]...)
	}
	d.progMu.Lock()
	defer d.progMu.Unlock()
	n := len(c.Timesteps)
	xn, cn, gn := W*c.MelDim, W*c.BNDim, c.GTMSlots*c.GTMHidden
	for i, ts := range c.Timesteps {
		tc := &d.times[i]
		o := stepOpts{commit: i == n-1, trace: trace}
		prog, err := d.stepProgram(B, o)
		if err != nil {
			return nil, fmt.Errorf("meanvc2: step: %w", err)
		}
		x, cond, spk := prog.Input("x"), prog.Input("cond"), prog.Input("spk")
		gk, gv := prog.Input("gtm_k"), prog.Input("gtm_v")
		for b, s := range states {
			copy(x[b*xn:], s.xw)
			copy(cond[b*cn:], conds[b])
			copy(spk[b*c.SpkDim:], timbres[b].Spk)
			copy(gk[b*gn:], timbres[b].K)
			copy(gv[b*gn:], timbres[b].V)
			s.positions(prog, b)
			for l := range c.Depth {
				copy(prog.Input(d.names[b].k[l]), s.kc[l])
				copy(prog.Input(d.names[b].v[l]), s.vc[l])
			}
		}
		copy(prog.Input("mod"), tc.mod)
		copy(prog.Input("fin"), tc.fin)
		if err := prog.Run(); err != nil {
			return nil, fmt.Errorf("meanvc2: step at offset %d: %w", states[0].offset, err)
		}
		u := prog.Output("u")
		// float32 like the reference: dt·u rounded, then subtracted.
		dt := float32(ts[0] - ts[1])
		for b, s := range states {
			ub := u[b*xn : (b+1)*xn]
			ct := &s.last.Calls[i]
			ct.T, ct.R, ct.U = ts[0], ts[1], append(ct.U[:0], ub...)
			ct.TEmb, ct.REmb, ct.Timbre, ct.InputEmbed, ct.NormOut, ct.Blocks = nil, nil, nil, nil, nil, nil
			if o.trace {
				cp := func(name string) []float32 { return append([]float32(nil), prog.Output(name)...) }
				ct.TEmb, ct.REmb = slices.Clone(tc.tEmb), slices.Clone(tc.rEmb)
				ct.Timbre, ct.InputEmbed, ct.NormOut = cp("temporal_timbre"), cp("input_embed"), cp("norm_out")
				for l := range c.Depth {
					ct.Blocks = append(ct.Blocks, cp(fmt.Sprintf("block%d", l)))
				}
			}
			x := s.xw
			for j := range x {
				x[j] -= dt * ub[j]
			}
			s.last.X[i] = append(s.last.X[i][:0], x...)
			if o.commit {
				for l := range c.Depth {
					copy(s.kc[l], prog.Output(d.names[b].knew[l]))
					copy(s.vc[l], prog.Output(d.names[b].vnew[l]))
				}
			}
		}
	}
	mels := make([][]float32, B)
	for b, s := range states {
		for l := range s.valid {
			s.valid[l] = min(s.valid[l]+c.ChunkSize, c.CacheFrames(l))
		}
		s.offset += c.ChunkSize
		s.last.Mel = append(s.last.Mel[:0], s.xw[:c.ChunkSize*c.MelDim]...)
		mels[b] = s.last.Mel
	}
	return mels, nil
}

// warm compiles the step programs (both calls of a step) for B states.
func (d *DiT) warm(B int) error {
	d.progMu.Lock()
	defer d.progMu.Unlock()
	for _, commit := range []bool{false, true} {
		if _, err := d.stepProgram(B, stepOpts{commit: commit}); err != nil {
			return err
		}
	}
	return nil
}

// stepProgram is the compiled step program for B states; d.progMu is held.
func (d *DiT) stepProgram(B int, o stepOpts) (engine.Program, error) {
	return d.progs.Get(fmt.Sprintf("B=%d,commit=%v,trace=%v", B, o.commit, o.trace), func() (*engine.Graph, error) {
		g := d.buildStep(B, o)
		return g, g.Err()
	})
}

// positions fills the RoPE positions and chunk masks for the current caches. Layer l's keys
// are [cache (cap rows, the newest valid ones last) ‖ W new]; on the timeline of the valid
// keys (index 0 = oldest valid), a key's chunk is idx/chunk, and the query at timeline
// index valid+i may see its own chunk, the t_p chunks before it, and the first
// t_f·BlockSize frames of the next one. Positions are absolute frame indices.
func (s *State) positions(prog engine.Program, b int) {
	c := s.d.Config
	W, chunk := c.Window(), c.ChunkSize
	nm := &s.d.names[b]
	qpos := prog.InputInt32(nm.qpos)
	for i := range qpos {
		qpos[i] = int32(s.offset + i)
	}
	ninf := float32(math.Inf(-1))
	for l := range c.Depth {
		capL, n := c.CacheFrames(l), s.valid[l]
		tp, tf := c.PastChunks[l], c.FutureChunks[l]
		lk := capL + W
		kpos := prog.InputInt32(nm.kpos[l])
		for j := range kpos {
			kpos[j] = int32(s.offset - capL + j)
		}
		mask := prog.Input(nm.mask[l])
		for i := range W {
			cq := (n + i) / chunk
			row := mask[i*lk : (i+1)*lk]
			for j := range row {
				tj := j - (capL - n)
				ok := false
				if tj >= 0 {
					ck := tj / chunk
					ok = ck == cq || (ck >= cq-tp && ck < cq) || (ck == cq+1 && tj%chunk < c.BlockSize*tf)
				}
				if ok {
					row[j] = 0
				} else {
					row[j] = ninf
				}
			}
		}
	}
}

// timeFreq writes the sinusoidal time features [sin(scale·t·f_i) ‖ cos(…)], f_i =
// exp(−i·ln(10000)/(half−1)), rounding like the float32 reference.
func timeFreq(dst []float32, t, scale float64) {
	half := len(dst) / 2
	step := float32(math.Log(10000) / float64(half-1))
	st := float32(scale * t)
	for i := range half {
		f := float32(math.Exp(float64(float32(i) * -step)))
		a := float64(st * f)
		dst[i] = float32(math.Sin(a))
		dst[half+i] = float32(math.Cos(a))
	}
}

// UpsampleBN turns one input chunk's BN frames [n, dim] (from all its ASR windows) into
// mel-rate condition frames: [prev ‖ bn] (prev = the previous chunk's last frame, nil for
// the first chunk) is linearly interpolated with aligned corners to points+1 frames and the
// first is dropped (run_rt.py: points = 16). Fewer than 2 input frames give nil, as in the
// reference.
func UpsampleBN(prev, bn []float32, dim, points int) []float32 {
	a := condAdapter{dim: dim, points: points}
	if prev != nil {
		a.prev, a.hasPrev = append([]float32(nil), prev...), true
	}
	a.begin(len(bn) / dim)
	return a.end(a.add(nil, bn))
}

// condAdapter is run_rt's BN adapter (UpsampleBN) run as a chunk's windows come in: each
// condition frame is emitted as soon as the BN frames it interpolates exist, so the early
// path (Stream.Write) gets the frames of a window before the chunk's next window runs, with
// the values the whole chunk gives.
type condAdapter struct {
	dim, points int
	src         []float32 // the previous chunk's last frame (if any) ‖ this chunk's frames so far
	prev        []float32 // the previous chunk's last BN frame
	hasPrev     bool
	span        int // source frames the open chunk's interpolation spans
	next        int // the next point to emit (1-based; point 0 is dropped)
}

// begin opens a chunk that will bring frames BN frames.
func (a *condAdapter) begin(frames int) {
	a.src = a.src[:0]
	if a.hasPrev {
		a.src = append(a.src, a.prev...)
	}
	a.span = len(a.src)/a.dim + frames
	a.next = 1
}

// add takes one window's BN frames and appends the condition frames now known to out.
func (a *condAdapter) add(out, bn []float32) []float32 {
	a.src = append(a.src, bn...)
	return a.emit(out, len(a.src)/a.dim)
}

// emit appends the points that read only the first have source frames.
func (a *condAdapter) emit(out []float32, have int) []float32 {
	n, d := a.span, a.dim
	if n < 2 {
		return out
	}
	scale := float64(n-1) / float64(a.points)
	for ; a.next <= a.points; a.next++ {
		pos := scale * float64(a.next)
		i0 := min(int(pos), n-1)
		lam := float32(pos - float64(i0))
		i1 := i0
		if lam != 0 {
			i1 = min(i0+1, n-1)
		}
		if i1 >= have {
			break
		}
		x, y := a.src[i0*d:(i0+1)*d], a.src[i1*d:(i1+1)*d]
		for k := range d {
			out = append(out, (1-lam)*x[k]+lam*y[k])
		}
	}
	return out
}

// end closes the chunk and appends its remaining condition frames. A chunk that brought
// fewer frames than begin was told (a final short chunk cut early) repeats its last frame
// in their place. Its last frame is the next chunk's previous one.
func (a *condAdapter) end(out []float32) []float32 {
	have := len(a.src) / a.dim
	if !a.hasPrev && have == 0 || a.hasPrev && have == 1 {
		a.span = 0
		return out // no window ran: no frames, nothing carried
	}
	last := a.src[(have-1)*a.dim:]
	for range a.span - have {
		a.src = append(a.src, last...)
	}
	last = a.src[len(a.src)-a.dim:]
	out = a.emit(out, a.span)
	a.prev = append(a.prev[:0], last...)
	a.hasPrev, a.span = true, 0
	return out
}

// CondBuffer queues condition frames between the front end and the DiT as run_rt.py does:
// a step takes Window frames and drops ChunkSize; at the end of the input the rest is
// flushed with the last frame repeated as the missing lookahead/current frames.
type CondBuffer struct {
	dim, chunk, block int
	buf               []float32
}

// NewCondBuffer makes an empty buffer for the config's widths.
func (c Config) NewCondBuffer() *CondBuffer {
	return &CondBuffer{dim: c.BNDim, chunk: c.ChunkSize, block: c.BlockSize}
}

// Len is the number of queued frames.
func (b *CondBuffer) Len() int { return len(b.buf) / b.dim }

// Push appends frames [n, dim].
func (b *CondBuffer) Push(frames []float32) { b.buf = append(b.buf, frames...) }

// Next pops one step's condition [chunk+block, dim] when enough frames are queued.
func (b *CondBuffer) Next() ([]float32, bool) {
	w := (b.chunk + b.block) * b.dim
	if len(b.buf) < w {
		return nil, false
	}
	cond := append([]float32(nil), b.buf[:w]...)
	b.buf = append(b.buf[:0], b.buf[b.chunk*b.dim:]...)
	return cond, true
}

// Flush returns the conditions of the end of the input: while a whole chunk is queued, it
// with the real lookahead frames when there are any, else the last frame repeated; then a
// partial chunk padded with its last frame. The buffer is left empty.
func (b *CondBuffer) Flush() [][]float32 {
	var out [][]float32
	d, w := b.dim, (b.chunk+b.block)*b.dim
	pad := func(cond []float32) []float32 {
		last := cond[len(cond)-d:]
		for len(cond) < w {
			cond = append(cond, last...)
		}
		return cond
	}
	for b.Len() >= b.chunk {
		// run_rt.py takes buffer[chunk:chunk+block] (the pushes keep it whole) or, with no
		// frame past the chunk, the last frame ×block.
		out = append(out, pad(append([]float32(nil), b.buf[:min(w, len(b.buf))]...)))
		b.buf = b.buf[b.chunk*d:]
	}
	if len(b.buf) > 0 {
		out = append(out, pad(append([]float32(nil), b.buf...)))
	}
	b.buf = nil
	return out
}
