// Package buffers holds the allocation-free containers of the audio hot path: a PCM FIFO and
// an RTP jitter buffer.
package buffers

// FIFO is a first-in first-out queue of float32 samples backed by one slice. It grows only
// when a write does not fit, so a FIFO sized for its steady state never allocates.
type FIFO struct {
	buf  []float32
	head int // index of the oldest sample
	tail int // one past the newest sample
}

// NewFIFO returns a FIFO with room for capacity samples before it has to grow.
func NewFIFO(capacity int) *FIFO { return &FIFO{buf: make([]float32, capacity)} }

// Len is the number of queued samples.
func (f *FIFO) Len() int { return f.tail - f.head }

// Write appends samples.
func (f *FIFO) Write(s []float32) {
	if f.tail+len(s) > len(f.buf) {
		f.compact(len(s))
	}
	f.tail += copy(f.buf[f.tail:], s)
}

// compact moves the queued samples to the front, growing the slice if room is still short.
func (f *FIFO) compact(extra int) {
	n := f.Len()
	if n+extra > len(f.buf) {
		grown := make([]float32, 2*(n+extra))
		copy(grown, f.buf[f.head:f.tail])
		f.buf = grown
	} else {
		copy(f.buf, f.buf[f.head:f.tail])
	}
	f.head, f.tail = 0, n
}

// Read moves up to len(dst) of the oldest samples into dst and returns how many it moved.
func (f *FIFO) Read(dst []float32) int {
	n := copy(dst, f.buf[f.head:f.tail])
	f.head += n
	if f.head == f.tail {
		f.head, f.tail = 0, 0
	}
	return n
}

// Peek returns the queued samples without removing them; valid until the next Write.
func (f *FIFO) Peek() []float32 { return f.buf[f.head:f.tail] }

// Discard drops up to n of the oldest samples and returns how many it dropped.
func (f *FIFO) Discard(n int) int {
	n = min(n, f.Len())
	f.head += n
	if f.head == f.tail {
		f.head, f.tail = 0, 0
	}
	return n
}

// DiscardCrossfade drops n samples from the front, crossfading over xf samples so the audio
// that plays next blends from the dropped audio into the kept audio instead of jumping.
// It returns the number of samples dropped.
func (f *FIFO) DiscardCrossfade(n, xf int) int {
	q := f.Peek()
	n = min(n, len(q))
	xf = min(xf, len(q)-n)
	for i := 0; i < xf; i++ {
		w := float32(i+1) / float32(xf+1)
		q[n+i] = q[i]*(1-w) + q[n+i]*w
	}
	return f.Discard(n)
}

// Reset empties the FIFO, keeping its storage.
func (f *FIFO) Reset() { f.head, f.tail = 0, 0 }
