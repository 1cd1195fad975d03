package audiofile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/voxpipe/voxpipe/internal/oggcrc"
	"gopkg.in/hraban/opus.v2"
)

// Ogg (RFC 3533): pages of up to 255 lacing segments, packets split into segments.

const (
	oggContinued = 0x01
	oggBOS       = 0x02
	oggEOS       = 0x04
	// maxOggPacket bounds one packet assembled from pages (a Vorbis setup header is a few
	// KiB; audio packets are smaller still).
	maxOggPacket = 1 << 20
	// noGranule is the granule position of a page on which no packet ends.
	noGranule = -1
)

type oggPage struct {
	flags   byte
	granule int64
	serial  uint32
	seq     uint32
	lacing  []byte
	body    []byte
}

// parseOggPage parses the page at the start of b (for detection: the caller's bytes).
func parseOggPage(b []byte) (p oggPage, size int, ok bool) {
	if len(b) < 27 || string(b[:4]) != "OggS" || b[4] != 0 {
		return p, 0, false
	}
	nseg := int(b[26])
	if len(b) < 27+nseg {
		return p, 0, false
	}
	body := 0
	for _, l := range b[27 : 27+nseg] {
		body += int(l)
	}
	size = 27 + nseg + body
	if len(b) < size {
		return p, 0, false
	}
	p = oggPage{flags: b[5], granule: int64(binary.LittleEndian.Uint64(b[6:])), serial: binary.LittleEndian.Uint32(b[14:]),
		seq: binary.LittleEndian.Uint32(b[18:]), lacing: b[27 : 27+nseg], body: b[27+nseg : size]}
	return p, size, true
}

// firstPacket is the packet starting a BOS page (a codec's identification header, which
// fills its page).
func (p oggPage) firstPacket() []byte {
	n := 0
	for _, l := range p.lacing {
		n += int(l)
		if l < 255 {
			break
		}
	}
	return p.body[:n]
}

// readOgg picks the codec from the beginning-of-stream pages in head: the first Opus or
// Vorbis stream is decoded, as players do.
func readOgg(br *bufio.Reader, head []byte, lim Limits) (*Audio, error) {
	var others []string
	for b := head; ; {
		p, size, ok := parseOggPage(b)
		if !ok || p.flags&oggBOS == 0 {
			break
		}
		b = b[size:]
		id := p.firstPacket()
		switch {
		case bytes.HasPrefix(id, []byte("OpusHead")):
			if len(id) < 19 || id[9] == 0 {
				return nil, fmt.Errorf("%w: Ogg Opus: bad OpusHead", ErrCorrupt)
			}
			return readOpus(br, int(id[9]), lim)
		case bytes.HasPrefix(id, []byte("\x01vorbis")):
			return readVorbis(br, p.serial, lim)
		case bytes.HasPrefix(id, []byte("\x7fFLAC")):
			others = append(others, "FLAC")
		case bytes.HasPrefix(id, []byte("Speex   ")):
			others = append(others, "Speex")
		case bytes.HasPrefix(id, []byte("\x80theora")):
			others = append(others, "Theora")
		case bytes.HasPrefix(id, []byte("fishead\x00")):
			// Ogg Skeleton: metadata about the other streams.
		default:
			others = append(others, fmt.Sprintf("%q", printable(id[:min(len(id), 8)])))
		}
	}
	if len(others) > 0 {
		return nil, fmt.Errorf("%w: Ogg stream of %v, not Vorbis or Opus: accepted formats are %s", ErrUnsupported, others, Accepted)
	}
	return nil, fmt.Errorf("%w: Ogg file with no Vorbis or Opus stream at its start", ErrCorrupt)
}

// oggReader reads the pages of one logical stream (one serial number at a time) and
// assembles its packets, checking each page's CRC and sequence number.
type oggReader struct {
	r       io.Reader
	serial  uint32
	seq     uint32
	started bool // a page of serial has been read
	hdr     [27 + 255]byte
	body    []byte
	pkt     []byte // the packet being assembled
	partial bool   // pkt continues on the next page
}

// page reads the next page of any stream. io.EOF: the stream ended cleanly at a page
// boundary.
func (o *oggReader) page() (oggPage, error) {
	if _, err := io.ReadFull(o.r, o.hdr[:27]); err != nil {
		if err == io.EOF {
			return oggPage{}, io.EOF
		}
		return oggPage{}, fmt.Errorf("Ogg page header: %w", err)
	}
	if string(o.hdr[:4]) != "OggS" || o.hdr[4] != 0 {
		return oggPage{}, fmt.Errorf("no Ogg page where one should start (%q)", printable(o.hdr[:4]))
	}
	nseg := int(o.hdr[26])
	if _, err := io.ReadFull(o.r, o.hdr[27:27+nseg]); err != nil {
		return oggPage{}, fmt.Errorf("Ogg page header: %w", eofUnexpected(err))
	}
	n := 0
	for _, l := range o.hdr[27 : 27+nseg] {
		n += int(l)
	}
	if cap(o.body) < n {
		o.body = make([]byte, n, 255*255)
	}
	o.body = o.body[:n]
	if _, err := io.ReadFull(o.r, o.body); err != nil {
		return oggPage{}, fmt.Errorf("Ogg page: %w", eofUnexpected(err))
	}
	want := binary.LittleEndian.Uint32(o.hdr[22:])
	binary.LittleEndian.PutUint32(o.hdr[22:], 0)
	if got := oggcrc.Update(oggcrc.Update(0, o.hdr[:27+nseg]), o.body); got != want {
		return oggPage{}, fmt.Errorf("Ogg page CRC %08x, want %08x", got, want)
	}
	h := o.hdr[:]
	return oggPage{flags: h[5], granule: int64(binary.LittleEndian.Uint64(h[6:])), serial: binary.LittleEndian.Uint32(h[14:]),
		seq: binary.LittleEndian.Uint32(h[18:]), lacing: h[27 : 27+nseg], body: o.body}, nil
}

func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// assemble takes the next page of the stream (p, of serial) and returns the packets
// completed on it, valid until the next call. It checks the page sequence and that a page
// continues a packet exactly when one is unfinished.
func (o *oggReader) assemble(dst [][]byte, p oggPage) ([][]byte, error) {
	if o.started && p.seq != o.seq+1 {
		return nil, fmt.Errorf("Ogg page %d follows page %d: pages are missing", p.seq, o.seq)
	}
	o.started, o.seq = true, p.seq
	if o.partial != (p.flags&oggContinued != 0) {
		return nil, errors.New("Ogg packet continuation does not match")
	}
	dst = dst[:0]
	var done []int // end offsets in o.pkt of the packets completed on this page
	start := 0
	for _, l := range p.lacing {
		o.pkt = append(o.pkt, p.body[start:start+int(l)]...)
		start += int(l)
		if len(o.pkt) > maxOggPacket {
			return nil, fmt.Errorf("Ogg packet over %d bytes", maxOggPacket)
		}
		if l < 255 {
			done = append(done, len(o.pkt))
		}
	}
	o.partial = len(p.lacing) > 0 && p.lacing[len(p.lacing)-1] == 255
	prev := 0
	for _, end := range done {
		dst = append(dst, o.pkt[prev:end])
		prev = end
	}
	// The unfinished tail moves to a new buffer, so the returned packets stay intact.
	tail := o.pkt[prev:]
	o.pkt = append(make([]byte, 0, len(tail)+4096), tail...)
	return dst, nil
}

// opusRate is the rate libopusfile always decodes at.
const opusRate = 48000

// readOpus decodes Ogg Opus with libopusfile (pre-skip, gain and end trimming follow the
// stream). channels is the first OpusHead's; libopusfile decodes the first Opus stream,
// the one that header belongs to.
func readOpus(r io.Reader, channels int, lim Limits) (*Audio, error) {
	s, err := newSink(Opus, opusRate, channels, lim)
	if err != nil {
		return nil, err
	}
	st, err := opus.NewStream(r)
	if err != nil {
		return nil, fmt.Errorf("%w: Ogg Opus: %w", ErrCorrupt, err)
	}
	defer st.Close()
	buf := make([]float32, 5760*channels) // 120 ms, the longest Opus packet
	holes := 0
	for {
		n, err := st.ReadFloat32(buf)
		if err == io.EOF {
			break
		}
		if errors.Is(err, opus.ErrStreamHole) && holes < 1000 {
			holes++ // some data was lost; decoding goes on after it
			continue
		}
		if err != nil {
			if err := s.stop(fmt.Errorf("%w: Ogg Opus: %w", ErrCorrupt, err)); err != nil {
				return nil, err
			}
			break
		}
		if n <= 0 || n*channels > len(buf) {
			return nil, fmt.Errorf("%w: Ogg Opus: decoder returned %d samples", ErrCorrupt, n)
		}
		if err := s.add(buf[:n*channels]); err != nil {
			return nil, err
		}
	}
	return s.finish()
}
