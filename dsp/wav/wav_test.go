package wav

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// enc describes a test file to encode by hand (independently of Write).
type enc struct {
	tag        uint16 // formatPCM, formatFloat, or formatExtensible
	subCode    uint16 // format code inside an extensible GUID
	bits       int    // container bits
	validBits  int    // bits field for non-extensible PCM (default: bits)
	channels   int
	rate       int
	pre, post  [][2]string // extra chunks (id, body) before fmt / between fmt and data
	dataSize   int         // -1: real size
	blockAlign int         // 0: computed
}

// encode builds a WAV file holding the integer or float codes given per sample.
func (e enc) encode(samples []float64) []byte {
	var data bytes.Buffer
	le := binary.LittleEndian
	float := e.tag == formatFloat || (e.tag == formatExtensible && e.subCode == formatFloat)
	for _, s := range samples {
		switch {
		case float && e.bits == 32:
			_ = binary.Write(&data, le, float32(s))
		case float:
			_ = binary.Write(&data, le, s)
		case e.bits == 8:
			data.WriteByte(byte(int(s) + 128))
		case e.bits == 16:
			_ = binary.Write(&data, le, int16(s))
		case e.bits == 24:
			v := int32(s)
			data.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16)})
		case e.bits == 32:
			_ = binary.Write(&data, le, int32(s))
		}
	}
	ba := e.blockAlign
	if ba == 0 {
		ba = e.channels * e.bits / 8
	}
	var fmtc bytes.Buffer
	bitsField := e.bits
	if e.validBits != 0 && e.tag != formatExtensible {
		bitsField = e.validBits
	}
	_ = binary.Write(&fmtc, le, e.tag)
	_ = binary.Write(&fmtc, le, uint16(e.channels))
	_ = binary.Write(&fmtc, le, uint32(e.rate))
	_ = binary.Write(&fmtc, le, uint32(e.rate*ba))
	_ = binary.Write(&fmtc, le, uint16(ba))
	_ = binary.Write(&fmtc, le, uint16(bitsField))
	if e.tag == formatExtensible {
		valid := e.validBits
		if valid == 0 {
			valid = e.bits
		}
		_ = binary.Write(&fmtc, le, uint16(22))
		_ = binary.Write(&fmtc, le, uint16(valid))
		_ = binary.Write(&fmtc, le, uint32(0))
		_ = binary.Write(&fmtc, le, e.subCode)
		fmtc.Write(guidSuffix)
	}
	var body bytes.Buffer
	chunk := func(id string, b []byte, size int) {
		body.WriteString(id)
		_ = binary.Write(&body, le, uint32(size))
		body.Write(b)
		if len(b)%2 == 1 {
			body.WriteByte(0)
		}
	}
	for _, c := range e.pre {
		chunk(c[0], []byte(c[1]), len(c[1]))
	}
	chunk("fmt ", fmtc.Bytes(), fmtc.Len())
	for _, c := range e.post {
		chunk(c[0], []byte(c[1]), len(c[1]))
	}
	size := data.Len()
	if e.dataSize >= 0 {
		size = e.dataSize
	}
	body.WriteString("data")
	_ = binary.Write(&body, le, uint32(size))
	body.Write(data.Bytes())
	var out bytes.Buffer
	out.WriteString("RIFF")
	_ = binary.Write(&out, le, uint32(4+body.Len()))
	out.WriteString("WAVE")
	out.Write(body.Bytes())
	return out.Bytes()
}

func TestReadFormats(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	type tc struct {
		name  string
		e     enc
		lo    float64 // code range
		hi    float64
		scale float64 // code → float
	}
	cases := []tc{
		{"pcm8", enc{tag: formatPCM, bits: 8}, -128, 127, 1.0 / 128},
		{"pcm16", enc{tag: formatPCM, bits: 16}, -32768, 32767, 1.0 / 32768},
		{"pcm24", enc{tag: formatPCM, bits: 24}, -8388608, 8388607, 1.0 / 8388608},
		{"pcm32", enc{tag: formatPCM, bits: 32}, -2147483648, 2147483647, 1.0 / 2147483648},
		{"pcm12in16", enc{tag: formatPCM, bits: 16, validBits: 12}, -2048, 2047, 16.0 / 32768},
		{"float32", enc{tag: formatFloat, bits: 32}, -1.5, 1.5, 1},
		{"float64", enc{tag: formatFloat, bits: 64}, -1, 1, 1},
		{"ext-pcm16", enc{tag: formatExtensible, subCode: formatPCM, bits: 16}, -32768, 32767, 1.0 / 32768},
		{"ext-pcm24in32", enc{tag: formatExtensible, subCode: formatPCM, bits: 32, validBits: 24}, -8388608, 8388607, 256.0 / 2147483648},
		{"ext-float32", enc{tag: formatExtensible, subCode: formatFloat, bits: 32}, -1, 1, 1},
		{"ext-float64", enc{tag: formatExtensible, subCode: formatFloat, bits: 64}, -1, 1, 1},
	}
	for _, c := range cases {
		for _, ch := range []int{1, 2, 6} {
			e := c.e
			e.channels, e.rate, e.dataSize = ch, 22050+ch, -1
			frames := 101
			codes := make([]float64, frames*ch)
			for i := range codes {
				switch {
				case i == 0:
					codes[i] = c.lo
				case i == 1:
					codes[i] = c.hi
				case e.tag == formatFloat || e.subCode == formatFloat:
					codes[i] = c.lo + (c.hi-c.lo)*rng.Float64()
				default:
					codes[i] = math.Floor(c.lo + (c.hi-c.lo+1)*rng.Float64())
				}
			}
			// Left-justify narrow samples in their container, as files store them.
			stored := make([]float64, len(codes))
			for i, v := range codes {
				stored[i] = v
				if c.name == "pcm12in16" {
					stored[i] = v * 16
				}
				if c.name == "ext-pcm24in32" {
					stored[i] = v * 256
				}
			}
			a, err := Read(bytes.NewReader(e.encode(stored)))
			if err != nil {
				t.Fatalf("%s/%dch: %v", c.name, ch, err)
			}
			if a.SampleRate != e.rate || a.Channels != ch || len(a.Data) != len(codes) || a.Truncated {
				t.Fatalf("%s/%dch: rate %d channels %d len %d truncated %v", c.name, ch, a.SampleRate, a.Channels, len(a.Data), a.Truncated)
			}
			for i, v := range codes {
				want := float32(v * c.scale)
				if e.bits == 64 && (e.tag == formatFloat || e.subCode == formatFloat) {
					want = float32(v)
				}
				if a.Data[i] != want {
					t.Fatalf("%s/%dch: sample %d = %v, want %v", c.name, ch, i, a.Data[i], want)
				}
			}
			if c.scale != 1 && (a.Data[0] != -1 || a.Data[1] > 1) { // 32-bit max rounds to 1 in float32
				t.Errorf("%s: full scale maps to %v..%v", c.name, a.Data[0], a.Data[1])
			}
		}
	}
}

func TestSkipChunks(t *testing.T) {
	e := enc{tag: formatPCM, bits: 16, channels: 1, rate: 8000, dataSize: -1,
		pre:  [][2]string{{"JUNK", "odd"}, {"bext", ""}},
		post: [][2]string{{"LIST", "INFOISFT\x05\x00\x00\x00Lavf\x00"}, {"fact", "\x04\x00\x00\x00"}, {"odd1", "x"}},
	}
	a, err := Read(bytes.NewReader(e.encode([]float64{1, -1, 16384})))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Data) != 3 || a.Data[2] != 0.5 {
		t.Fatalf("data %v", a.Data)
	}
}

func TestFixture(t *testing.T) {
	a, err := ReadFile(filepath.Join("..", "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	d := a.Duration()
	t.Logf("speech_en_48k.wav: %d Hz, %d ch, %d bits, %d frames, %v", a.SampleRate, a.Channels, a.BitsPerSample, a.Frames(), d)
	if a.SampleRate != 48000 || a.Channels != 1 || a.BitsPerSample != 16 || a.Float || a.Truncated {
		t.Fatalf("format: %+v", a)
	}
	if d < 3*time.Second || d > 3500*time.Millisecond {
		t.Errorf("duration %v, want about 3.2 s", d)
	}
	var peak, energy float64
	for _, v := range a.Data {
		peak = max(peak, math.Abs(float64(v)))
		energy += float64(v) * float64(v)
	}
	rms := math.Sqrt(energy / float64(len(a.Data)))
	if peak < 0.1 || peak > 1 || rms < 0.01 {
		t.Errorf("peak %.3f rms %.4f: does not look like speech", peak, rms)
	}
	if m := a.Mono(); len(m) != len(a.Data) || &m[0] != &a.Data[0] {
		t.Error("Mono of mono audio should be the data itself")
	}
	// Rewriting the 16-bit data reproduces the file's sample bytes exactly.
	var buf bytes.Buffer
	if err := Write(&buf, a.Data, a.SampleRate, 1); err != nil {
		t.Fatal(err)
	}
	orig, _ := os.ReadFile(filepath.Join("..", "..", "testdata", "speech_en_48k.wav"))
	if !bytes.HasSuffix(orig, buf.Bytes()[44:]) {
		t.Error("16-bit samples do not survive a read/write round trip")
	}
}

func TestWriteRoundTrip(t *testing.T) {
	for _, ch := range []int{1, 2, 5} {
		n := 1000 * ch
		in := make([]float32, n)
		for i := range in {
			in[i] = float32(int(i*7919%65536)-32768) / 32768
		}
		in[0], in[1%n] = 1.5, -2 // clipped
		var buf bytes.Buffer
		if err := Write(&buf, in, 16000, ch); err != nil {
			t.Fatal(err)
		}
		a, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if a.SampleRate != 16000 || a.Channels != ch || len(a.Data) != n {
			t.Fatalf("%d ch: %+v", ch, a)
		}
		for i := range in {
			want := min(max(in[i], -1), 32767.0/32768)
			if a.Data[i] != want {
				t.Fatalf("%d ch: sample %d = %v, want %v", ch, i, a.Data[i], want)
			}
		}
	}
	// Rounding and NaN.
	for _, c := range []struct {
		in   float32
		want int16
	}{{0.5 / 32768, 1}, {-0.5 / 32768, -1}, {0.49 / 32768, 0}, {float32(math.NaN()), 0}, {float32(math.Inf(-1)), -32768}} {
		if got := pcm16(c.in); got != c.want {
			t.Errorf("pcm16(%v) = %d, want %d", c.in, got, c.want)
		}
	}
	// Stereo Mono averages.
	a := &Audio{SampleRate: 10, Channels: 2, Data: []float32{1, 0, -1, -0.5}}
	if m := a.Mono(); len(m) != 2 || m[0] != 0.5 || m[1] != -0.75 {
		t.Errorf("Mono = %v", m)
	}
	if a.Duration() != 200*time.Millisecond {
		t.Errorf("Duration = %v", a.Duration())
	}
	// WriteFile / ReadFile.
	path := filepath.Join(t.TempDir(), "x.wav")
	if err := WriteFile(path, []float32{0.25, -0.25}, 8000, 2); err != nil {
		t.Fatal(err)
	}
	if a, err := ReadFile(path); err != nil || a.Frames() != 1 || a.Data[1] != -0.25 {
		t.Fatalf("ReadFile: %+v %v", a, err)
	}
	// Parameter errors.
	for _, c := range []struct {
		n, rate, ch int
		want        string
	}{{3, 16000, 2, "whole number"}, {2, 0, 1, "sample rate"}, {2, 16000, 0, "channels"}} {
		if err := Write(io.Discard, make([]float32, c.n), c.rate, c.ch); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Write(%v): %v, want %q", c, err, c.want)
		}
	}
}

func TestStreamingWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.wav")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := NewWriter(f, 24000, 2)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(5))
	var all []float32
	for i := 0; i < 50; i++ {
		chunk := make([]float32, 2*rng.Intn(300))
		for j := range chunk {
			chunk[j] = float32(rng.NormFloat64() * 0.3)
		}
		if err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
		all = append(all, chunk...)
		if i == 25 {
			// Before Close the sizes read as unknown: the file so far is readable.
			a, err := ReadFile(path)
			if err != nil {
				t.Fatalf("mid-stream read: %v", err)
			}
			if len(a.Data) != len(all) || a.Truncated {
				t.Fatalf("mid-stream read: %d samples (truncated %v), want %d", len(a.Data), a.Truncated, len(all))
			}
		}
	}
	if err := w.Write([]float32{1}); err == nil {
		t.Error("a partial frame should be rejected")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(all[:2]); err == nil {
		t.Error("write after Close should fail")
	}
	got, _ := os.ReadFile(path)
	var want bytes.Buffer
	if err := Write(&want, all, 24000, 2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("streamed file (%d bytes) differs from Write's (%d bytes)", len(got), want.Len())
	}
	// No allocation per write once the buffer has grown.
	w2, _ := NewWriter(discardSeeker{}, 16000, 1)
	frame := make([]float32, 320)
	if allocs := testing.AllocsPerRun(100, func() { _ = w2.Write(frame) }); allocs != 0 {
		t.Errorf("Writer.Write allocates %.1f times per call", allocs)
	}
}

// discardSeeker is an io.WriteSeeker that drops what is written.
type discardSeeker struct{}

func (discardSeeker) Write(p []byte) (int, error)    { return len(p), nil }
func (discardSeeker) Seek(int64, int) (int64, error) { return 0, nil }

// seekBuf is an in-memory io.WriteSeeker.
type seekBuf struct {
	b   []byte
	pos int
}

func (s *seekBuf) Write(p []byte) (int, error) {
	if need := s.pos + len(p); need > len(s.b) {
		s.b = append(s.b, make([]byte, need-len(s.b))...)
	}
	copy(s.b[s.pos:], p)
	s.pos += len(p)
	return len(p), nil
}

func (s *seekBuf) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		s.pos = int(off)
	case io.SeekCurrent:
		s.pos += int(off)
	case io.SeekEnd:
		s.pos = len(s.b) + int(off)
	}
	return int64(s.pos), nil
}

func TestWriterAtOffset(t *testing.T) {
	s := &seekBuf{}
	_, _ = s.Write([]byte("prefix"))
	w, err := NewWriter(s, 8000, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Write([]float32{0.5, -0.5})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, _ = s.Write([]byte("tail"))
	a, err := Read(bytes.NewReader(s.b[6:]))
	if err != nil || len(a.Data) != 2 || a.Data[0] != 0.5 {
		t.Fatalf("%+v %v", a, err)
	}
	if !bytes.HasSuffix(s.b, []byte("tail")) || len(s.b) != 6+44+4+4 {
		t.Fatalf("writer left the stream at the wrong position (%d bytes)", len(s.b))
	}
}

func TestTruncation(t *testing.T) {
	e := enc{tag: formatPCM, bits: 24, channels: 2, rate: 44100, dataSize: -1, post: [][2]string{{"LIST", "abc"}}}
	codes := make([]float64, 2*50)
	for i := range codes {
		codes[i] = float64(i * 1000)
	}
	file := e.encode(codes)
	dataStart := len(file) - len(codes)*3
	for n := 0; n < len(file); n++ {
		a, err := Read(bytes.NewReader(file[:n]))
		if n < dataStart {
			if err == nil {
				t.Fatalf("cut at %d (before the data at %d) read without error", n, dataStart)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut at %d: %v", n, err)
		}
		frames := (n - dataStart) / 6
		if a.Frames() != frames || !a.Truncated || len(a.Data) != frames*2 {
			t.Fatalf("cut at %d: %d frames truncated=%v, want %d frames truncated", n, a.Frames(), a.Truncated, frames)
		}
	}
	if a, err := Read(bytes.NewReader(file)); err != nil || a.Truncated || a.Frames() != 50 {
		t.Fatalf("whole file: %+v %v", a, err)
	}
	// Unknown size reads to the end without being flagged.
	e.dataSize = unknownSize
	if a, err := Read(bytes.NewReader(e.encode(codes))); err != nil || a.Truncated || a.Frames() != 50 {
		t.Fatalf("unknown size: %+v %v", a, err)
	}
	// A partial last frame within a complete chunk is dropped and flagged.
	e.dataSize = len(codes)*3 - 1
	if a, err := Read(bytes.NewReader(e.encode(codes))); err != nil || !a.Truncated || a.Frames() != 49 {
		t.Fatalf("partial frame: %+v %v", a, err)
	}
}

func TestHostile(t *testing.T) {
	good := enc{tag: formatPCM, bits: 16, channels: 1, rate: 8000, dataSize: -1}
	mod := func(f func(*enc)) []byte {
		e := good
		f(&e)
		return e.encode([]float64{1, 2})
	}
	patch := func(b []byte, at int, v []byte) []byte {
		b = append([]byte(nil), b...)
		copy(b[at:], v)
		return b
	}
	base := good.encode([]float64{1, 2})
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "RIFF header"},
		{"not riff", []byte("OggS\x00\x00\x00\x00WAVE"), "not a RIFF"},
		{"rifx", patch(base, 0, []byte("RIFX")), "RIFX"},
		{"rf64", patch(base, 0, []byte("RF64")), "64-bit"},
		{"avi", patch(base, 8, []byte("AVI ")), "not WAVE"},
		{"no fmt", []byte("RIFF\x04\x00\x00\x00WAVE"), "no fmt"},
		{"no data", base[:36], "no data"},
		{"data before fmt", append([]byte("RIFF\x00\x00\x00\x00WAVEdata\x02\x00\x00\x00\x01\x00"), base[12:]...), "before fmt"},
		{"fmt too small", patch(base, 16, []byte{8, 0, 0, 0}), "fmt chunk of 8 bytes"},
		{"fmt huge", patch(base, 16, []byte{0xff, 0xff, 0xff, 0x7f}), "fmt chunk of"},
		{"fmt truncated", base[:30], "reading fmt chunk"},
		{"zero channels", patch(base, 22, []byte{0, 0}), "0 channels"},
		{"zero rate", patch(base, 24, []byte{0, 0, 0, 0}), "sample rate 0"},
		{"huge rate", patch(base, 24, []byte{0xff, 0xff, 0xff, 0xff}), "out of range"},
		{"zero bits", patch(base, 34, []byte{0, 0}), "0-bit PCM"},
		{"40 bits", patch(base, 34, []byte{40, 0}), "40-bit PCM"},
		{"float16", mod(func(e *enc) { e.tag, e.bits = formatFloat, 16 }), "16-bit float"},
		{"block align", mod(func(e *enc) { e.blockAlign = 3 }), "block align 3"},
		{"mp3", patch(base, 20, []byte{0x55, 0}), "MP3"},
		{"ulaw", patch(base, 20, []byte{7, 0}), "not supported"},
		{"ext bad guid", func() []byte {
			b := mod(func(e *enc) { e.tag, e.subCode = formatExtensible, formatPCM })
			return patch(b, 20+26, []byte{0xde, 0xad})
		}(), "GUID"},
		{"ext valid bits", func() []byte {
			b := mod(func(e *enc) { e.tag, e.subCode = formatExtensible, formatPCM })
			return patch(b, 20+18, []byte{17, 0})
		}(), "17 valid bits"},
		{"ext cbsize", func() []byte {
			b := mod(func(e *enc) { e.tag, e.subCode = formatExtensible, formatPCM })
			return patch(b, 20+16, []byte{0, 0})
		}(), "extension of 0 bytes"},
		{"two fmt", mod(func(e *enc) { e.post = [][2]string{{"fmt ", string(base[20:36])}} }), "two fmt"},
		{"chunk beyond end", append(append([]byte(nil), base[:36]...), []byte("LIST\xff\xff\xff\x00abc")...), "only 3 present"},
	}
	for _, c := range cases {
		_, err := Read(bytes.NewReader(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "wav: ") {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	if _, err := Read(bytes.NewReader(mod(func(e *enc) { e.tag = formatExtensible; e.subCode = formatPCM }))); err != nil {
		t.Errorf("extensible PCM: %v", err)
	}
	// A data chunk declaring 4 GiB holds 2 samples: no huge allocation, flagged truncated.
	big := mod(func(e *enc) { e.dataSize = 0xFFFFFFF0 })
	a, err := Read(bytes.NewReader(big))
	if err != nil || a.Frames() != 2 || !a.Truncated {
		t.Fatalf("huge data size: %+v %v", a, err)
	}
	if cap(a.Data) > 1<<20 {
		t.Errorf("allocated %d samples for 2", cap(a.Data))
	}
	// Endless chunks without data stop.
	var endless bytes.Buffer
	endless.Write(base[:36])
	for i := 0; i < maxChunks+10; i++ {
		endless.WriteString("JUNK\x00\x00\x00\x00")
	}
	if _, err := Read(&endless); err == nil || !strings.Contains(err.Error(), "no data chunk within") {
		t.Errorf("endless chunks: %v", err)
	}
	// Read errors other than EOF are reported.
	boom := errors.New("boom")
	if _, err := Read(io.MultiReader(bytes.NewReader(base[:46]), errReader{boom})); !errors.Is(err, boom) {
		t.Errorf("reader error: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func FuzzRead(f *testing.F) {
	f.Add(enc{tag: formatPCM, bits: 16, channels: 1, rate: 16000, dataSize: -1}.encode([]float64{1, -2, 300}))
	f.Add(enc{tag: formatPCM, bits: 24, channels: 2, rate: 44100, dataSize: -1,
		post: [][2]string{{"LIST", "odd"}}}.encode([]float64{1, -2, 300, 4}))
	f.Add(enc{tag: formatExtensible, subCode: formatFloat, bits: 32, channels: 3, rate: 48000, dataSize: -1}.encode([]float64{0.5, -0.5, 0}))
	f.Add(enc{tag: formatPCM, bits: 8, channels: 1, rate: 8000, dataSize: 100}.encode([]float64{1, 2}))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Read(bytes.NewReader(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "wav: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		if a.Channels < 1 || a.SampleRate < 1 || len(a.Data)%a.Channels != 0 {
			t.Fatalf("invalid audio: rate %d channels %d len %d", a.SampleRate, a.Channels, len(a.Data))
		}
		if len(a.Data) > len(data) {
			t.Fatalf("%d samples from %d bytes", len(a.Data), len(data))
		}
		_ = a.Mono()
		_ = a.Duration()
		if a.Channels <= math.MaxUint16/2 {
			var buf bytes.Buffer
			if err := Write(&buf, a.Data, a.SampleRate, a.Channels); err != nil {
				t.Fatalf("rewrite: %v", err)
			}
			b, err := Read(&buf)
			if err != nil || b.Frames() != a.Frames() || b.Channels != a.Channels {
				t.Fatalf("reread: %v", err)
			}
		}
	})
}
