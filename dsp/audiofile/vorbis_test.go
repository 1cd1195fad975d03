package audiofile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/internal/oggcrc"
)

// oggPacket is a packet of an Ogg stream and, when it is the last to end on its page, that
// page's granule position (else noGranule).
type oggPacket struct {
	data    []byte
	granule int64
}

// demux reads the packets of the file's first stream.
func demux(t *testing.T, data []byte) (uint32, []oggPacket) {
	t.Helper()
	first, _, ok := parseOggPage(data)
	if !ok {
		t.Fatal("not Ogg")
	}
	o := &oggReader{r: bytes.NewReader(data), serial: first.serial}
	var out []oggPacket
	var pkts [][]byte
	for {
		p, err := o.page()
		if err != nil {
			break
		}
		if pkts, err = o.assemble(pkts, p); err != nil {
			t.Fatal(err)
		}
		for i, pk := range pkts {
			g := int64(noGranule)
			if i == len(pkts)-1 {
				g = p.granule
			}
			out = append(out, oggPacket{append([]byte(nil), pk...), g})
		}
	}
	return first.serial, out
}

// mux writes packets as an Ogg stream: the first alone on a BOS page, then a page at each
// packet that carries a granule position, the last with the EOS flag.
func mux(serial uint32, pkts []oggPacket) []byte {
	var out []byte
	seq := uint32(0)
	page := func(group [][]byte, flags byte, granule int64) {
		var lacing, body []byte
		for _, p := range group {
			for n := len(p); ; n -= 255 {
				if n < 255 {
					lacing = append(lacing, byte(n))
					break
				}
				lacing = append(lacing, 255)
			}
			body = append(body, p...)
		}
		if len(lacing) > 255 {
			panic("page too big for this test writer")
		}
		h := []byte("OggS\x00")
		h = append(h, flags)
		h = binary.LittleEndian.AppendUint64(h, uint64(granule))
		h = binary.LittleEndian.AppendUint32(h, serial)
		h = binary.LittleEndian.AppendUint32(h, seq)
		seq++
		h = append(h, 0, 0, 0, 0, byte(len(lacing)))
		h = append(h, lacing...)
		binary.LittleEndian.PutUint32(h[22:], oggcrc.Update(oggcrc.Update(0, h), body))
		out = append(append(out, h...), body...)
	}
	page([][]byte{pkts[0].data}, oggBOS, 0)
	var group [][]byte
	for i, p := range pkts[1:] {
		group = append(group, p.data)
		last := i == len(pkts)-2
		if p.granule != noGranule || last || i < 2 {
			flags := byte(0)
			if last {
				flags = oggEOS
			}
			g := p.granule
			if i < 2 {
				g = 0
			}
			page(group, flags, g)
			group = nil
		}
	}
	return out
}

// bitWriter writes Vorbis bits, least significant first.
type bitWriter struct {
	b []byte
	n int
}

func (w *bitWriter) put(v uint64, bits int) *bitWriter {
	for i := range bits {
		if w.n%8 == 0 {
			w.b = append(w.b, 0)
		}
		if v>>i&1 != 0 {
			w.b[w.n/8] |= 1 << (w.n % 8)
		}
		w.n++
	}
	return w
}

// setupWith is a setup header whose codebooks are written by books (and nothing after them:
// the check never gets that far for the hostile ones).
func setupWith(count int, books func(w *bitWriter)) []byte {
	w := &bitWriter{b: []byte("\x05vorbis"), n: 7 * 8}
	w.put(uint64(count-1), 8)
	books(w)
	return w.b
}

func TestVorbisRemuxStillDecodes(t *testing.T) {
	data, err := os.ReadFile("testdata/speech_16k.ogg")
	if err != nil {
		t.Fatal(err)
	}
	serial, pkts := demux(t, data)
	want, err := Decode(data, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(mux(serial, pkts), Limits{})
	if err != nil || got.Frames() != want.Frames() {
		t.Fatalf("remuxed: %v, %d frames, want %d", err, got.Frames(), want.Frames())
	}
	// A comment header claiming 2³²−1 comments (the decoder would allocate 64 GiB for them)
	// is not passed on.
	hostile := append([]oggPacket(nil), pkts...)
	hostile[1] = oggPacket{[]byte("\x03vorbis\x00\x00\x00\x00\xff\xff\xff\xff\x01"), noGranule}
	got, err = Decode(mux(serial, hostile), Limits{})
	if err != nil || got.Frames() != want.Frames() {
		t.Errorf("comment header claiming 2^32 comments: %v", err)
	}
	// Chained: the same stream twice, under another serial the second time.
	chained := append(mux(serial, pkts), mux(serial+1, pkts)...)
	got, err = Decode(chained, Limits{})
	if err != nil || got.Frames() != 2*want.Frames() || got.Truncated {
		t.Errorf("chained: %v, %d frames, want %d", err, got.Frames(), 2*want.Frames())
	}
}

func TestHostileVorbisSetup(t *testing.T) {
	data, err := os.ReadFile("testdata/speech_16k.ogg")
	if err != nil {
		t.Fatal(err)
	}
	serial, pkts := demux(t, data)
	book := func(w *bitWriter, dims, entries int) *bitWriter {
		return w.put(0x564342, 24).put(uint64(dims), 16).put(uint64(entries), 24)
	}
	for _, c := range []struct {
		name  string
		setup []byte
		msg   string
	}{
		{"2^24 entries", setupWith(1, func(w *bitWriter) {
			book(w, 1, 1<<24-1).put(1, 1).put(23, 5).put(1<<24-1, 24) // ordered: all of length 24
		}), "entries"},
		{"2^16 dimensions", setupWith(1, func(w *bitWriter) {
			book(w, 65535, 256).put(1, 1).put(7, 5).put(256, 9).put(2, 4) // lookup 2: 2^24 values
		}), "dimensions"},
		{"no used entry", setupWith(1, func(w *bitWriter) {
			book(w, 1, 1000).put(0, 1).put(1, 1) // sparse, every entry unused
			for range 1000 {
				w.put(0, 1)
			}
			w.put(0, 4)
		}), "incomplete"},
		{"lengths past the end", setupWith(1, func(w *bitWriter) {
			book(w, 1, 60000).put(0, 1).put(0, 1) // lengths of 60000 entries, none given
		}), "cut off"},
		{"values past the end", setupWith(1, func(w *bitWriter) {
			book(w, 8, 256).put(1, 1).put(7, 5).put(256, 9) // 256 entries of length 8
			w.put(2, 4).put(0, 32).put(0, 32).put(15, 4).put(0, 1)
		}), "values cut off"},
		{"too many entries in all", setupWith(256, func(w *bitWriter) {
			for range 256 {
				book(w, 1, 1<<16).put(1, 1).put(15, 5).put(1<<16, 17).put(0, 4)
			}
		}), "in all"},
		{"floor type 0", setupWith(1, func(w *bitWriter) {
			book(w, 1, 2).put(0, 1).put(0, 1).put(0, 5).put(0, 5).put(0, 4) // two 1-bit codewords
			w.put(0, 6).put(0, 16)                                          // one time-domain placeholder
			w.put(0, 6).put(0, 16)                                          // one floor, of type 0
			w.put(255, 8).put(44100, 16).put(256, 16).put(63, 6).put(255, 8).put(0, 4).put(0, 8)
		}), "floor type 0"},
		{"overfull tree", setupWith(1, func(w *bitWriter) {
			book(w, 1, 3).put(0, 1).put(0, 1)
			w.put(0, 5).put(0, 5).put(0, 5).put(0, 4) // three codewords of 1 bit
		}), "Huffman"},
	} {
		hostile := append([]oggPacket(nil), pkts...)
		hostile[2] = oggPacket{c.setup, noGranule}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		_, err := Decode(mux(serial, hostile), Limits{})
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if !(errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupported)) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want ErrCorrupt or ErrUnsupported mentioning %q", c.name, err, c.msg)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 || took > 2*time.Second {
			t.Errorf("%s: %d MiB allocated, %v", c.name, alloc>>20, took)
		}
	}
}

func TestHuffSimAcceptsCompleteCodes(t *testing.T) {
	// Complete codes in awkward orders: the simulated builder places every codeword.
	for _, lengths := range [][]int{
		{1, 1},
		{2, 1, 2},
		{3, 1, 3, 2},
		{3, 3, 2, 1},
		{1, 3, 2, 3},
		{4, 4, 2, 3, 1},
		{3, 2, 3, 1},
		{5, 5, 5, 5, 3, 3, 3, 2, 2},
		{2, 5, 3, 5, 2, 3, 5, 3, 5},
	} {
		s := newHuffSim(len(lengths))
		var kraft float64
		for e, l := range lengths {
			kraft += 1 / float64(int(1)<<l)
			if !s.put(uint32(e), uint8(l)) {
				t.Errorf("%v: entry %d (length %d) not placed", lengths, e, l)
			}
		}
		if kraft != 1 {
			t.Fatalf("%v is not complete", lengths)
		}
	}
}
