package audioout

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/voxpipe/voxpipe/internal/oggcrc"
)

// oggWriter frames Opus packets into Ogg pages (RFC 3533, RFC 7845): the OpusHead and
// OpusTags pages, then one page per packet so every chunk a client receives is playable
// as soon as it arrives.
type oggWriter struct {
	serial  uint32
	seq     uint32
	granule uint64 // always counted at 48 kHz (RFC 7845 §4)
	scale   uint64 // 48000 / encoder rate
	ended   bool
}

// preSkip is the encoder delay decoders drop (at 48 kHz): libopus's lookahead.
const preSkip = 312

func newOggWriter(rate int) *oggWriter {
	return &oggWriter{serial: rand.Uint32(), scale: uint64(48000 / rate)}
}

func (o *oggWriter) header(dst []byte) []byte {
	head := append([]byte("OpusHead"), 1, 1) // version 1, mono
	head = binary.LittleEndian.AppendUint16(head, preSkip)
	head = binary.LittleEndian.AppendUint32(head, uint32(48000/o.scale))
	head = append(head, 0, 0, 0) // output gain 0, mapping family 0
	dst = o.page(dst, head, 0x02, 0)
	vendor := "voxpipe"
	tags := append([]byte("OpusTags"), binary.LittleEndian.AppendUint32(nil, uint32(len(vendor)))...)
	tags = append(tags, vendor...)
	tags = binary.LittleEndian.AppendUint32(tags, 0)
	return o.page(dst, tags, 0, 0)
}

// packet writes one Opus packet of samples frames (at the encoder rate) on its own page.
func (o *oggWriter) packet(dst, pkt []byte, samples int, last bool) []byte {
	o.granule += uint64(samples) * o.scale
	flags := byte(0)
	if last {
		flags = 0x04
		o.ended = true
	}
	return o.page(dst, pkt, flags, o.granule)
}

func (o *oggWriter) page(dst, data []byte, flags byte, granule uint64) []byte {
	start := len(dst)
	dst = append(dst, "OggS"...)
	dst = append(dst, 0, flags)
	dst = binary.LittleEndian.AppendUint64(dst, granule)
	dst = binary.LittleEndian.AppendUint32(dst, o.serial)
	dst = binary.LittleEndian.AppendUint32(dst, o.seq)
	o.seq++
	crcAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	// Lacing: 255-byte segments and a final shorter one (0 when the size is a multiple).
	n := len(data)
	dst = append(dst, byte(n/255+1))
	for range n / 255 {
		dst = append(dst, 255)
	}
	dst = append(dst, byte(n%255))
	dst = append(dst, data...)
	binary.LittleEndian.PutUint32(dst[crcAt:], oggcrc.Update(0, dst[start:]))
	return dst
}
