package audiofile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/jfreymuth/vorbis"
)

// Ogg Vorbis is decoded with github.com/jfreymuth/vorbis (the decoder inside
// github.com/jfreymuth/oggvorbis), fed packets by our own Ogg reader. That decoder trusts
// its headers: a codebook may claim 2²⁴ entries of 2¹⁶ dimensions with nothing behind them
// (it reads zeros past a packet's end), and it allocates for them; a comment header may
// claim 2³² comments. So the headers are checked here first: the identification header's
// fields, every codebook of the setup header (sizes within a budget, every length present,
// and a Huffman tree that the decoder's own builder fills completely, so decoding a value
// always ends), and the comment header is replaced by an empty one (its text is not used).
// What the decoder does with audio packets is then bounded by the validated sizes: it may
// still panic on a malformed packet, which try turns into an error.

// Budgets for one setup header. libvorbis's codebooks have at most a few thousand entries
// of at most 8 dimensions.
const (
	maxBookEntries   = 1 << 16
	maxBookDims      = 256
	maxTotalEntries  = 1 << 18
	maxTotalValues   = 1 << 22 // entries × dimensions of the books with a value lookup
	maxHuffmanSteps  = 1 << 26 // the decoder's tree builder's work, simulated
	maxVorbisPackets = 1 << 30
)

// vorbisID is a validated identification header.
type vorbisID struct {
	channels, rate int
	blocksize      [2]int
}

func parseVorbisID(p []byte) (vorbisID, error) {
	if len(p) < 30 || !bytes.HasPrefix(p, []byte("\x01vorbis")) {
		return vorbisID{}, errors.New("bad identification header")
	}
	h := p[7:]
	id := vorbisID{channels: int(h[4]), rate: int(binary.LittleEndian.Uint32(h[5:]))}
	b0, b1 := int(h[21]&0x0F), int(h[21]>>4)
	switch {
	case binary.LittleEndian.Uint32(h) != 0:
		return id, fmt.Errorf("Vorbis version %d", binary.LittleEndian.Uint32(h))
	case id.channels < 1:
		return id, errors.New("0 channels")
	case id.rate < 1 || id.rate > maxRate:
		return id, fmt.Errorf("sample rate %d Hz", uint32(id.rate))
	case b0 < 6 || b1 > 13 || b0 > b1:
		return id, fmt.Errorf("block sizes 2^%d, 2^%d (want 64 ≤ short ≤ long ≤ 8192)", b0, b1)
	case h[22]&1 == 0:
		return id, errors.New("identification header framing bit unset")
	}
	id.blocksize = [2]int{1 << b0, 1 << b1}
	return id, nil
}

// emptyComments is a comment header with no vendor and no comments.
var emptyComments = []byte("\x03vorbis\x00\x00\x00\x00\x00\x00\x00\x00\x01")

// bitReader reads a Vorbis packet's bits, least significant first, noting a read past the end.
type bitReader struct {
	b   []byte
	pos int // in bits
	eof bool
}

func (r *bitReader) read(n int) uint32 {
	if r.pos+n > 8*len(r.b) {
		r.eof = true
		r.pos = 8 * len(r.b)
		return 0
	}
	var v uint32
	for i := range n {
		if r.b[r.pos>>3]>>(r.pos&7)&1 != 0 {
			v |= 1 << i
		}
		r.pos++
	}
	return v
}

func ilog(x int) int {
	n := 0
	for x > 0 {
		n++
		x >>= 1
	}
	return n
}

// checkVorbisSetup validates the codebooks of a setup header (see the top of this file).
func checkVorbisSetup(p []byte) error {
	if !bytes.HasPrefix(p, []byte("\x05vorbis")) {
		return errors.New("bad setup header")
	}
	r := &bitReader{b: p[7:]}
	books := int(r.read(8)) + 1
	totalEntries, totalValues, steps := 0, 0, 0
	for b := range books {
		if r.read(24) != 0x564342 {
			return fmt.Errorf("codebook %d: no sync pattern", b)
		}
		dims, entries := int(r.read(16)), int(r.read(24))
		switch {
		case r.eof:
			return fmt.Errorf("codebook %d: cut off", b)
		case dims < 1 || dims > maxBookDims:
			return fmt.Errorf("codebook %d: %d dimensions (1..%d decoded)", b, dims, maxBookDims)
		case entries < 2 || entries > maxBookEntries:
			return fmt.Errorf("codebook %d: %d entries (2..%d decoded)", b, entries, maxBookEntries)
		}
		if totalEntries += entries; totalEntries > maxTotalEntries {
			return fmt.Errorf("codebooks of more than %d entries in all", maxTotalEntries)
		}
		// The lengths, put into a copy of the decoder's tree builder in the same order.
		t := newHuffSim(entries)
		var kraft uint64 // Σ 2^(32−length) over used entries: 2^32 for a full tree
		used := 0
		put := func(e int, length int) error {
			if length > 32 {
				return fmt.Errorf("codebook %d: codeword of %d bits", b, length)
			}
			used++
			kraft += 1 << (32 - length)
			if !t.put(uint32(e), uint8(length)) {
				return fmt.Errorf("codebook %d: codeword lengths do not make a Huffman tree", b)
			}
			return nil
		}
		if ordered := r.read(1) == 1; !ordered {
			sparse := r.read(1) == 1
			for e := range entries {
				if !sparse || r.read(1) == 1 {
					if err := put(e, int(r.read(5))+1); err != nil {
						return err
					}
				}
				if r.eof {
					return fmt.Errorf("codebook %d: cut off", b)
				}
			}
		} else {
			length := int(r.read(5)) + 1
			for e := 0; e < entries; length++ {
				num := int(r.read(ilog(entries - e)))
				if r.eof || e+num > entries {
					return fmt.Errorf("codebook %d: bad ordered lengths", b)
				}
				for ; num > 0; num-- {
					if err := put(e, length); err != nil {
						return err
					}
					e++
				}
			}
		}
		if steps += t.steps; steps > maxHuffmanSteps || t.overflow {
			return fmt.Errorf("codebook %d: Huffman tree too costly to build", b)
		}
		if kraft != 1<<32 && used != 1 {
			return fmt.Errorf("codebook %d: codeword lengths leave the Huffman tree incomplete", b)
		}
		switch lookup := r.read(4); lookup {
		case 0:
		case 1, 2:
			r.read(32) // minimum value
			r.read(32) // delta value
			bits := int(r.read(4)) + 1
			r.read(1) // sequence flag
			n := entries * dims
			if lookup == 1 {
				n = int(math.Floor(math.Pow(float64(entries), 1/float64(dims))))
			}
			if totalValues += entries * dims; totalValues > maxTotalValues {
				return fmt.Errorf("codebooks of more than %d values in all", maxTotalValues)
			}
			if r.pos+n*bits > 8*len(r.b) {
				return fmt.Errorf("codebook %d: values cut off", b)
			}
			r.pos += n * bits
		default:
			return fmt.Errorf("codebook %d: lookup type %d", b, lookup)
		}
		if r.eof {
			return fmt.Errorf("codebook %d: cut off", b)
		}
	}
	return checkVorbisFloors(r)
}

// checkVorbisFloors reads on through the time-domain placeholders and the floors, refusing
// floor type 0: no encoder has written it since Vorbis 1.0, and the decoder's version of
// it costs up to a few hundred operations a sample.
func checkVorbisFloors(r *bitReader) error {
	for range r.read(6) + 1 {
		if r.read(16) != 0 {
			return errors.New("bad time-domain transform")
		}
	}
	for f := range r.read(6) + 1 {
		switch t := r.read(16); t {
		case 0:
			return fmt.Errorf("%w: Vorbis floor type 0 (pre-1.0 streams)", ErrUnsupported)
		case 1:
			parts := make([]int, r.read(5))
			maxClass := 0
			for i := range parts {
				parts[i] = int(r.read(4))
				maxClass = max(maxClass, parts[i])
			}
			dims := make([]int, maxClass+1)
			for c := range dims {
				dims[c] = int(r.read(3)) + 1
				sub := int(r.read(2))
				if sub != 0 {
					r.read(8)
				}
				for range 1 << sub {
					r.read(8)
				}
			}
			r.read(2)
			bits := int(r.read(4))
			for _, c := range parts {
				for range dims[c] {
					r.read(bits)
				}
			}
		default:
			return fmt.Errorf("floor %d of type %d", f, t)
		}
		if r.eof {
			return fmt.Errorf("floor %d: cut off", f)
		}
	}
	return nil
}

// huffSim is jfreymuth/vorbis's huffmanBuilder (vorbis v1.0.2, MIT), step for step, with
// its array bounds checked and its work counted: the decoder builds the same tree from the
// same lengths, so a tree this fills completely is one the decoder's lookups always leave.
type huffSim struct {
	code      []uint32
	minLength []uint8
	steps     int
	overflow  bool
}

func newHuffSim(entries int) *huffSim {
	size := entries*2 - 2
	return &huffSim{code: make([]uint32, size), minLength: make([]uint8, size/2)}
}

func (t *huffSim) put(entry uint32, length uint8) bool {
	return t.putAt(0, entry, length-1)
}

func (t *huffSim) putAt(index, entry uint32, length uint8) bool {
	t.steps++
	if t.overflow || int(index)+1 >= len(t.code) || t.steps > maxHuffmanSteps {
		t.overflow = true
		return false
	}
	if length < t.minLength[index/2] {
		return false
	}
	if length == 0 {
		if t.code[index] == 0 {
			t.code[index] = entry*2 + 1
			return true
		}
		if t.code[index+1] == 0 {
			t.code[index+1] = entry*2 + 1
			t.minLength[index/2] = 1
			return true
		}
		t.minLength[index/2] = 1
		return false
	}
	if t.code[index]&1 == 0 {
		if t.code[index] == 0 {
			t.code[index] = t.findEmpty(index + 2)
		}
		if t.putAt(t.code[index], entry, length-1) {
			return true
		}
	}
	if t.code[index+1]&1 == 0 {
		if t.code[index+1] == 0 {
			t.code[index+1] = t.findEmpty(index + 2)
		}
		if t.putAt(t.code[index+1], entry, length-1) {
			return true
		}
	}
	t.minLength[index/2] = length + 1
	return false
}

func (t *huffSim) findEmpty(index uint32) uint32 {
	for int(index) < len(t.code) && t.code[index] != 0 {
		index += 2
		t.steps++
	}
	return index
}

// vorbisLink is the state of one logical Vorbis stream (a chained file has several).
type vorbisLink struct {
	dec     *vorbis.Decoder
	id      vorbisID
	headers int   // header packets seen (3 before audio)
	start   int64 // the sink's frame count when its audio began
	trimmed bool  // a granule position has been applied
	buf     []float32
	decoded bool // an audio packet was decoded on the current page
}

// readVorbis decodes the Vorbis stream whose first page has serial, and the links chained
// after it if they keep its rate and channels.
func readVorbis(br *bufio.Reader, serial uint32, lim Limits) (*Audio, error) {
	o := &oggReader{r: br, serial: serial}
	var s *sink
	link := &vorbisLink{}
	ended := false // the current link's end-of-stream page was read
	// fail ends the decode at an error: see sink.stop.
	fail := func(err error) error {
		if !errors.Is(err, ErrTooLarge) && !errors.Is(err, ErrTooLong) && !errors.Is(err, ErrUnsupported) {
			err = fmt.Errorf("%w: Ogg Vorbis: %w", ErrCorrupt, err)
		}
		if s == nil {
			return err
		}
		return s.stop(err)
	}
	var pkts [][]byte
	packets := 0
pages:
	for {
		p, err := o.page()
		if err == io.EOF {
			break // a clean end at a page boundary
		}
		if err != nil {
			if err := fail(err); err != nil {
				return nil, err
			}
			break
		}
		if p.serial != o.serial {
			if !ended || p.flags&oggBOS == 0 || !bytes.HasPrefix(p.firstPacket(), []byte("\x01vorbis")) {
				continue // another stream multiplexed in, or one after ours that is not Vorbis
			}
			// A chained link.
			o.serial, o.started, o.partial, o.pkt = p.serial, false, false, nil
			link, ended = &vorbisLink{}, false
		} else if ended {
			continue
		}
		if pkts, err = o.assemble(pkts, p); err != nil {
			if err := fail(err); err != nil {
				return nil, err
			}
			break
		}
		link.decoded = false
		for _, pkt := range pkts {
			if packets++; packets > maxVorbisPackets {
				return nil, fail(errors.New("too many packets"))
			}
			if s, err = link.packet(pkt, s, lim); err != nil {
				if err := fail(err); err != nil {
					return nil, err
				}
				break pages
			}
		}
		// Granule positions (Vorbis I §A.2): the first audio page's says how many samples
		// its packets end at (fewer than decoded: trim the start), the last page's where
		// the stream ends (trim the end).
		if s != nil && link.decoded && p.granule != noGranule {
			got := s.frames() - link.start
			switch {
			case p.flags&oggEOS != 0:
				if p.granule < got {
					s.trimTo(link.start + max(p.granule, 0))
				}
			case !link.trimmed && p.granule < got:
				s.cut(link.start, got-max(p.granule, 0))
			}
			link.trimmed = true
		}
		if p.flags&oggEOS != 0 {
			ended = true
		}
	}
	if s == nil || link.headers < 3 && s.frames() == 0 {
		return nil, fmt.Errorf("%w: Ogg Vorbis: the stream ends before its headers do", ErrCorrupt)
	}
	return s.finish()
}

// packet handles one packet of a link: the three headers, then audio.
func (l *vorbisLink) packet(pkt []byte, s *sink, lim Limits) (*sink, error) {
	switch l.headers {
	case 0:
		id, err := parseVorbisID(pkt)
		if err != nil {
			return s, err
		}
		if s == nil {
			if s, err = newSink(Vorbis, id.rate, id.channels, lim); err != nil {
				return nil, err
			}
		} else if id.rate != s.rate || id.channels != s.ch {
			return s, fmt.Errorf("%w: a chained link changes to %d Hz, %d channels", ErrUnsupported, id.rate, id.channels)
		}
		l.id, l.dec = id, &vorbis.Decoder{}
		if err := try(Vorbis, func() error { return l.dec.ReadHeader(pkt) }); err != nil {
			return s, err
		}
	case 1:
		if !bytes.HasPrefix(pkt, []byte("\x03vorbis")) {
			return s, errors.New("no comment header")
		}
		if err := try(Vorbis, func() error { return l.dec.ReadHeader(emptyComments) }); err != nil {
			return s, err
		}
	case 2:
		if err := checkVorbisSetup(pkt); err != nil {
			return s, fmt.Errorf("setup header: %w", err)
		}
		if err := try(Vorbis, func() error { return l.dec.ReadHeader(pkt) }); err != nil {
			return s, err
		}
		l.buf = make([]float32, l.dec.BufferSize())
		l.start = s.frames()
	default:
		if len(pkt) == 0 || pkt[0]&1 != 0 {
			return s, nil // not an audio packet (Vorbis I §4.3.1): skipped
		}
		var out []float32
		if err := try(Vorbis, func() (err error) { out, err = l.dec.DecodeInto(pkt, l.buf); return err }); err != nil {
			return s, err
		}
		if len(out)%l.id.channels != 0 || len(out) > len(l.buf) {
			return s, fmt.Errorf("decoder returned %d samples", len(out))
		}
		l.decoded = true
		return s, s.add(out)
	}
	l.headers++
	return s, nil
}
