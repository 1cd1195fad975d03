package audiofile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hajimehoshi/go-mp3"
)

// mpegHeader is an MPEG audio frame header.
type mpegHeader struct {
	version   int // 1, 2, or 25 (MPEG 2.5)
	layer     int // 1, 2, 3
	crc       bool
	bitrate   int // bits per second
	rate      int
	padding   int
	mono      bool
	frameSize int // bytes, layer III only
}

var (
	mpegRates = map[int][3]int{1: {44100, 48000, 32000}, 2: {22050, 24000, 16000}, 25: {11025, 12000, 8000}}
	// Layer III bitrates in kbps, by MPEG-1 and MPEG-2/2.5; index 0 ("free") and 15 are invalid.
	l3Bitrates1 = [15]int{0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320}
	l3Bitrates2 = [15]int{0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160}
)

// parseMPEGHeader parses an MPEG audio frame header at the start of b: a sync word and no
// reserved field values. Layer I/II headers are parsed far enough to be named in errors.
func parseMPEGHeader(b []byte) (mpegHeader, bool) {
	if len(b) < 4 || b[0] != 0xFF || b[1]&0xE0 != 0xE0 {
		return mpegHeader{}, false
	}
	var h mpegHeader
	switch (b[1] >> 3) & 3 {
	case 0:
		h.version = 25
	case 2:
		h.version = 2
	case 3:
		h.version = 1
	default:
		return h, false
	}
	h.layer = 4 - int((b[1]>>1)&3)
	if h.layer == 4 {
		return h, false
	}
	h.crc = b[1]&1 == 0
	bi, ri := int(b[2]>>4), int((b[2]>>2)&3)
	if bi == 0 || bi == 15 || ri == 3 || b[3]&3 == 2 {
		return h, false
	}
	h.rate = mpegRates[h.version][ri]
	h.padding = int((b[2] >> 1) & 1)
	h.mono = b[3]>>6 == 3
	if h.layer == 3 {
		if h.version == 1 {
			h.bitrate = l3Bitrates1[bi] * 1000
			h.frameSize = 144*h.bitrate/h.rate + h.padding
		} else {
			h.bitrate = l3Bitrates2[bi] * 1000
			h.frameSize = 72*h.bitrate/h.rate + h.padding
		}
	}
	return h, true
}

// samplesPerFrame of a layer III frame.
func (h mpegHeader) samplesPerFrame() int {
	if h.version == 1 {
		return 1152
	}
	return 576
}

// sideInfoSize of a layer III frame.
func (h mpegHeader) sideInfoSize() int {
	switch {
	case h.version == 1 && h.mono:
		return 17
	case h.version == 1:
		return 32
	case h.mono:
		return 9
	}
	return 17
}

// findMP3 finds the first layer III frame in head. Without a tag before it the frame must
// start the file; after an ID3 tag (scan) it may follow some padding, and must then be
// followed by a second frame of the same kind when head holds one. off is its offset.
func findMP3(head []byte, scan bool) (off int, h mpegHeader, ok bool) {
	last := 0
	if scan {
		last = len(head) - 4
	}
	for off = 0; off <= last; off++ {
		if head[off] != 0xFF {
			continue
		}
		h, ok = parseMPEGHeader(head[off:])
		if !ok || h.layer != 3 {
			continue
		}
		if !scan {
			return off, h, true
		}
		next := off + h.frameSize
		if next+4 > len(head) {
			return off, h, true // the file ends (or the window does) within the frame
		}
		if h2, ok2 := parseMPEGHeader(head[next:]); ok2 && h2.layer == 3 && h2.version == h.version && h2.rate == h.rate {
			return off, h, true
		}
	}
	return 0, mpegHeader{}, false
}

// gapless is what a Xing/Info frame says about the stream: that frame decodes to silence
// and is not audio; with a LAME (or FFmpeg "Lavc") extension, the encoder delay and
// padding to trim, in samples.
type gapless struct {
	infoFrame       bool
	delay, padding  int
	haveDelayAndPad bool
}

// decoderDelay is what layer III decoders (go-mp3 too) add to the encoder's delay: the
// synthesis filterbank's 528 samples plus one.
const decoderDelay = 529

// parseXing reads the Xing/Info frame that encoders put first, when frame (the whole first
// frame, header included) is one.
func parseXing(frame []byte, h mpegHeader) gapless {
	at := 4 + h.sideInfoSize()
	if h.crc {
		at += 2
	}
	if len(frame) < at+8 {
		return gapless{}
	}
	tag := string(frame[at : at+4])
	if tag != "Xing" && tag != "Info" {
		return gapless{}
	}
	g := gapless{infoFrame: true}
	flags := binary.BigEndian.Uint32(frame[at+4:])
	p := at + 8
	for _, f := range []struct {
		bit  uint32
		size int
	}{{1, 4}, {2, 4}, {4, 100}, {8, 4}} {
		if flags&f.bit != 0 {
			p += f.size
		}
	}
	// LAME extension: 9-byte encoder string, …, delay and padding (12 bits each) at +21.
	if len(frame) >= p+24 {
		enc := string(frame[p : p+4])
		if enc == "LAME" || enc == "Lavc" || enc == "Lavf" || enc == "L3.9" || enc == "GOGO" {
			v := int(frame[p+21])<<16 | int(frame[p+22])<<8 | int(frame[p+23])
			g.delay, g.padding, g.haveDelayAndPad = v>>12, v&0xFFF, true
		}
	}
	return g
}

// nonSeeker hides Seek, so go-mp3 does not scan the whole stream ahead of decoding.
type nonSeeker struct{ r io.Reader }

func (n nonSeeker) Read(p []byte) (int, error) { return n.r.Read(p) }

// readMP3 decodes layer III frames from r, which starts at the first frame (h). go-mp3
// always decodes to 16-bit stereo; a mono stream (by its first frame) keeps one channel.
func readMP3(r *bufio.Reader, h mpegHeader, lim Limits) (*Audio, error) {
	if h.version == 25 {
		return nil, fmt.Errorf("%w: MPEG-2.5 audio (%d Hz): accepted formats are %s", ErrUnsupported, h.rate, Accepted)
	}
	var g gapless
	if first, err := r.Peek(h.frameSize); err == nil || errors.Is(err, io.EOF) {
		g = parseXing(first, h)
	}
	ch := 2
	if h.mono {
		ch = 1
	}
	s, err := newSink(MP3, h.rate, ch, lim)
	if err != nil {
		return nil, err
	}
	var d *mp3.Decoder
	if err := try(MP3, func() (err error) { d, err = mp3.NewDecoder(nonSeeker{r}); return err }); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if d.SampleRate() != h.rate {
		return nil, fmt.Errorf("%w: MP3 first frame at %d Hz, decoder says %d Hz", ErrCorrupt, h.rate, d.SampleRate())
	}
	skip := 0 // frames still to drop from the start
	if g.infoFrame {
		skip = h.samplesPerFrame()
		if g.haveDelayAndPad {
			skip += g.delay + decoderDelay
		}
	}
	buf := make([]byte, 4*1152*4)
	pcm := make([]float32, 0, 2*1152*4)
	for {
		var n int
		err := try(MP3, func() (err error) { n, err = d.Read(buf); return err })
		frames := n / 4
		pcm = pcm[:0]
		for i := range frames {
			if skip > 0 {
				skip--
				continue
			}
			l := float32(int16(binary.LittleEndian.Uint16(buf[4*i:]))) * (1.0 / 32768)
			if ch == 1 {
				pcm = append(pcm, l)
			} else {
				pcm = append(pcm, l, float32(int16(binary.LittleEndian.Uint16(buf[4*i+2:])))*(1.0/32768))
			}
		}
		if aerr := s.add(pcm); aerr != nil {
			return nil, aerr
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if err := s.stop(fmt.Errorf("%w: MP3: %w", ErrCorrupt, err)); err != nil {
				return nil, err
			}
			break
		}
	}
	if g.haveDelayAndPad && !s.truncated {
		s.trimTo(s.frames() - int64(max(g.padding-decoderDelay, 0)))
	}
	return s.finish()
}
