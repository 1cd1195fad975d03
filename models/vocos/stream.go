package vocos

import (
	"fmt"

	"github.com/voxpipe/voxpipe/dsp"
)

// Stream is MeanVC2's streaming vocoder (run_rt `_decode_mel`). Each Push takes the DiT's
// new mel frames, decodes them together with the last Overlap frames of the previous window,
// and returns audio: the first decode minus its last WavOverlap samples; later decodes start
// with a linear crossfade of the held-back tail into their first WavOverlap samples, then
// their middle; the last WavOverlap samples are always held back for the next call. Flush
// returns that tail. The samples of each step are exactly the reference's.
//
// A Stream is used by one goroutine at a time; several Streams may share a Model.
type Stream struct {
	m     *Model
	istft *dsp.ISTFT

	prev    []float32 // last Overlap frames of the previous window, [n, Mels] in [−1, 1]
	next    []float32 // prev being rebuilt (the new frames may come partly from prev)
	nPrev   int
	window  []float32 // the vocoder input of the last Push, [Mels, F] in [0, 1]
	frames  int       // F of window
	decoded []float32 // its decode, (F−1)·hop samples
	tail    []float32 // held back, WavOverlap samples
	hasTail bool
	emit    []float32
	fadeIn  []float32 // linspace(0, 1, WavOverlap)
	fadeOut []float32 // linspace(1, 0, WavOverlap)
}

// NewStream starts a stream on m.
func (m *Model) NewStream() (*Stream, error) {
	st, err := dsp.NewISTFT(m.Dims.NFFT, m.Config.Hop, m.window)
	if err != nil {
		return nil, fmt.Errorf("vocos: %w", err)
	}
	w := m.Config.WavOverlap
	s := &Stream{m: m, istft: st, prev: make([]float32, m.Config.Overlap*m.Dims.Mels),
		next: make([]float32, m.Config.Overlap*m.Dims.Mels),
		tail: make([]float32, w), fadeIn: make([]float32, w), fadeOut: make([]float32, w)}
	for i := range w {
		a := 1.0
		if w > 1 {
			a = float64(i) / float64(w-1)
		}
		s.fadeIn[i], s.fadeOut[i] = float32(a), float32(1-a)
	}
	return s, nil
}

// Push decodes new mel frames, [n, Mels] row-major (time-major, as the DiT emits them) in
// the DiT's [−1, 1] domain, and returns the audio now final. The slice is the Stream's and
// valid until the next call.
func (s *Stream) Push(mel []float32) ([]float32, error) {
	streams, mels := [1]*Stream{s}, [1][]float32{mel}
	if err := s.m.push(streams[:], mels[:]); err != nil {
		return nil, err
	}
	return s.emit, nil
}

// Warm compiles the program for batches of B windows of F frames ahead of their first use.
func (m *Model) Warm(F, B int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.program(F, B)
	return err
}

// Frames is the length of the window a Push of values mel values decodes: the overlap
// frames kept from the last Push and the new ones.
func (s *Stream) Frames(values int) int { return s.nPrev + values/s.m.Dims.Mels }

// PushBatch is Push for several streams of the model at once (distinct, at most MaxBatch,
// each window of the same frame count): one program decodes every window, and each stream's
// audio is bit for bit what Push gives it alone. Each result is owned by its Stream until
// its next call. On an error no stream has changed.
func (m *Model) PushBatch(streams []*Stream, mels [][]float32) ([][]float32, error) {
	if err := m.push(streams, mels); err != nil {
		return nil, err
	}
	out := make([][]float32, len(streams))
	for b, s := range streams {
		out[b] = s.emit
	}
	return out, nil
}

func (m *Model) push(streams []*Stream, mels [][]float32) error {
	B := len(streams)
	if B == 0 || B > MaxBatch || len(mels) != B {
		return fmt.Errorf("vocos: %d streams (at most %d) for %d pushes", B, MaxBatch, len(mels))
	}
	F := 0
	for b, s := range streams {
		if s.m != m {
			return fmt.Errorf("vocos: a stream of another model")
		}
		for _, o := range streams[:b] {
			if o == s {
				return fmt.Errorf("vocos: a stream twice in one batch")
			}
		}
		f, err := s.prepare(mels[b])
		if err != nil {
			return err
		}
		if b > 0 && f != F {
			return fmt.Errorf("vocos: batched windows of %d and %d frames", F, f)
		}
		F = f
	}
	nm, nb := m.Dims.Mels, m.Dims.NFFT/2+1
	m.mu.Lock()
	defer m.mu.Unlock()
	prog, err := m.program(F, B)
	if err != nil {
		return fmt.Errorf("vocos: %w", err)
	}
	in := prog.Input("mel")
	for b, s := range streams {
		copy(in[b*nm*F:], s.window)
	}
	if err := prog.Run(); err != nil {
		return fmt.Errorf("vocos: run: %w", err)
	}
	re, im := prog.Output("re"), prog.Output("im")
	w := m.Config.WavOverlap
	for b, s := range streams {
		d, err := s.istft.Inverse(re[b*F*nb:(b+1)*F*nb], im[b*F*nb:(b+1)*F*nb], F, s.decoded)
		if err != nil {
			return fmt.Errorf("vocos: %w", err)
		}
		s.decoded = d
		if len(d) < w || (s.hasTail && len(d) < 2*w) {
			return fmt.Errorf("vocos: %d frames decode to %d samples, too few for the %d-sample crossfade", F, len(d), w)
		}
	}
	for _, s := range streams {
		s.finish(F)
	}
	return nil
}

// prepare builds the vocoder input for mel (the window [Mels, F]: cached frames then the new
// ones, transposed and mapped (mel+1)/2) and the next window's overlap frames, leaving the
// stream's state as it was; it returns F.
func (s *Stream) prepare(mel []float32) (int, error) {
	nm := s.m.Dims.Mels
	if len(mel) == 0 || len(mel)%nm != 0 {
		return 0, fmt.Errorf("vocos: stream push of %d values is not whole frames of %d bins", len(mel), nm)
	}
	n := len(mel) / nm
	F := s.nPrev + n
	if cap(s.window) < F*nm {
		s.window = make([]float32, F*nm)
	}
	s.window = s.window[:F*nm]
	frame := func(t int) []float32 {
		if t < s.nPrev {
			return s.prev[t*nm : (t+1)*nm]
		}
		return mel[(t-s.nPrev)*nm : (t-s.nPrev+1)*nm]
	}
	for t := range F {
		for c, v := range frame(t) {
			s.window[c*F+t] = (v + 1) / 2
		}
	}
	// The next window's overlap: the last Overlap frames of this one, kept unmapped.
	keep := min(s.m.Config.Overlap, F)
	for k := range keep {
		copy(s.next[k*nm:(k+1)*nm], frame(F-keep+k))
	}
	return F, nil
}

// finish commits a decoded window of F frames (s.decoded): the overlap for the next one,
// the crossfade with the held-back tail, and the new tail.
func (s *Stream) finish(F int) {
	s.frames = F
	w := len(s.tail)
	d := s.decoded
	s.prev, s.next = s.next, s.prev
	s.nPrev = min(s.m.Config.Overlap, F)
	s.emit = s.emit[:0]
	body := d[:len(d)-w]
	if s.hasTail {
		for i := range w {
			s.emit = append(s.emit, s.tail[i]*s.fadeOut[i]+d[i]*s.fadeIn[i])
		}
		body = d[w : len(d)-w]
	}
	s.emit = append(s.emit, body...)
	copy(s.tail, d[len(d)-w:])
	s.hasTail = true
}

// Flush returns the held-back tail (empty before any Push) and resets the stream.
func (s *Stream) Flush() []float32 {
	var out []float32
	if s.hasTail {
		out = append(out, s.tail...)
	}
	s.Reset()
	return out
}

// Reset forgets the mel overlap and the tail.
func (s *Stream) Reset() {
	s.nPrev, s.hasTail, s.frames = 0, false, 0
	s.window = s.window[:0]
	s.decoded = s.decoded[:0]
}
