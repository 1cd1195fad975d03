package stream

// Delay is an identity processor with a fixed latency: passthrough that keeps the timing of
// the voice it stands in for, so A/B switching does not move the audio in time.
type Delay struct {
	info ProcessorInfo
	line []float32 // the last Latency input samples
}

// NewDelay returns a passthrough at rate with the given chunk size and latency (samples).
func NewDelay(rate, chunk, latency int) *Delay {
	return &Delay{info: ProcessorInfo{SampleRate: rate, ChunkSize: chunk, Latency: latency}, line: make([]float32, latency, latency+chunk)}
}

// Info implements Processor.
func (d *Delay) Info() ProcessorInfo { return d.info }

// Process implements Processor.
func (d *Delay) Process(out, in []float32) ([]float32, error) {
	d.line = append(d.line, in...)
	out = append(out, d.line[:len(in)]...)
	d.line = d.line[:copy(d.line, d.line[len(in):])]
	return out, nil
}

// Flush implements Processor.
func (d *Delay) Flush(out []float32) ([]float32, error) {
	out = append(out, d.line...)
	clear(d.line)
	return out, nil
}

// Reset implements Processor.
func (d *Delay) Reset() { clear(d.line) }

// CloseProcessor frees a processor that holds resources (one with a Close method).
func CloseProcessor(p Processor) {
	if c, ok := p.(interface{ Close() }); ok {
		c.Close()
	}
}
