package audioout

import (
	"encoding/binary"
	"math/bits"
)

// flacBlock is the samples per FLAC frame (a common encoder default).
const flacBlock = 4096

// flacRateCodes are the frame-header codes of the rates a client may ask for.
var flacRateCodes = map[int]uint64{8000: 4, 16000: 5, 22050: 6, 24000: 7, 44100: 9, 48000: 10}

// flacEncoder writes a mono 16-bit FLAC stream as the audio comes: the stream header, then
// one frame per 4096 samples, each sample predicted from the two before (FLAC's fixed
// order-2 predictor) with the residual Rice-coded. The STREAMINFO says the length is
// unknown, as a stream's must, so chunks concatenate to a playable .flac.
type flacEncoder struct {
	rate    int
	pending []int32
	frame   uint64 // frame number
	started bool
}

func newFLACEncoder(rate int) *flacEncoder { return &flacEncoder{rate: rate} }

func (e *flacEncoder) encode(dst []byte, x []float32, last bool) []byte {
	if !e.started {
		e.started = true
		dst = e.header(dst)
	}
	for _, v := range x {
		e.pending = append(e.pending, int32(toInt16(v)))
	}
	for len(e.pending) >= flacBlock || last && len(e.pending) > 0 {
		n := min(len(e.pending), flacBlock)
		dst = e.frameOf(dst, e.pending[:n])
		e.pending = e.pending[:copy(e.pending, e.pending[n:])]
	}
	return dst
}

// header is "fLaC" and the STREAMINFO block (the only, so the last, metadata block).
func (e *flacEncoder) header(dst []byte) []byte {
	dst = append(dst, "fLaC"...)
	dst = append(dst, 0x80, 0, 0, 34) // last block, type 0 (STREAMINFO), 34 bytes
	dst = binary.BigEndian.AppendUint16(dst, flacBlock)
	dst = binary.BigEndian.AppendUint16(dst, flacBlock)
	dst = append(dst, 0, 0, 0, 0, 0, 0) // frame sizes unknown
	var w bitWriter
	w.put(uint64(e.rate), 20)
	w.put(0, 3)  // channels − 1
	w.put(15, 5) // bits per sample − 1
	w.put(0, 36) // total samples unknown
	dst = append(dst, w.bytes()...)
	return append(dst, make([]byte, 16)...) // MD5 unknown
}

// frameOf encodes one frame of samples.
func (e *flacEncoder) frameOf(dst []byte, x []int32) []byte {
	start := len(dst)
	var w bitWriter
	w.put(0xFFF8, 16)      // sync, fixed block size
	sizeCode := uint64(12) // 4096
	if len(x) != flacBlock {
		sizeCode = 7 // 16-bit (size − 1) follows the frame number
	}
	w.put(sizeCode, 4)
	w.put(flacRateCodes[e.rate], 4)
	w.put(0, 4) // mono
	w.put(4, 3) // 16 bits per sample
	w.put(0, 1)
	w.utf8(e.frame)
	e.frame++
	if sizeCode == 7 {
		w.put(uint64(len(x)-1), 16)
	}
	dst = append(dst, w.bytes()...)
	dst = append(dst, crc8(dst[start:]))

	w = bitWriter{}
	const order = 2
	if len(x) <= order {
		w.put(0b000010, 8) // verbatim subframe (type 000001, no wasted bits)
		for _, v := range x {
			w.put(uint64(uint16(v)), 16)
		}
	} else {
		w.put(uint64(0b001000|order)<<1, 8) // fixed predictor subframe of the order
		for _, v := range x[:order] {
			w.put(uint64(uint16(v)), 16)
		}
		res := make([]uint32, len(x)-order)
		var sum uint64
		for i := order; i < len(x); i++ {
			r := x[i] - 2*x[i-1] + x[i-2]
			res[i-order] = uint32(r<<1) ^ uint32(r>>31) // zigzag
			sum += uint64(res[i-order])
		}
		k := 0 // Rice parameter ≈ log2 of the mean residual
		if mean := sum / uint64(len(res)); mean > 0 {
			k = min(bits.Len64(mean)-1, 14)
		}
		w.put(0, 2) // Rice coding, 4-bit parameter
		w.put(0, 4) // partition order 0
		w.put(uint64(k), 4)
		for _, u := range res {
			for q := u >> k; q > 0; q-- { // unary quotient
				w.put(0, 1)
			}
			w.put(1, 1)
			w.put(uint64(u)&(1<<k-1), k)
		}
	}
	dst = append(dst, w.bytes()...) // zero-padded to a byte
	return binary.BigEndian.AppendUint16(dst, crc16(dst[start:]))
}

// bitWriter packs bits most significant first.
type bitWriter struct {
	buf  []byte
	acc  uint64
	nacc int
}

func (w *bitWriter) put(v uint64, n int) {
	for n > 0 {
		take := min(n, 56-w.nacc)
		w.acc = w.acc<<take | (v>>(n-take))&(1<<take-1)
		w.nacc += take
		n -= take
		for w.nacc >= 8 {
			w.buf = append(w.buf, byte(w.acc>>(w.nacc-8)))
			w.nacc -= 8
		}
	}
}

// utf8 writes v in FLAC's extended UTF-8 coding (frame numbers).
func (w *bitWriter) utf8(v uint64) {
	if v < 0x80 {
		w.put(v, 8)
		return
	}
	n := 2 // bytes
	for v >= 1<<(5*n+1) {
		n++
	}
	w.put((0xFF<<(8-n))&0xFF|v>>(6*(n-1)), 8)
	for i := n - 2; i >= 0; i-- {
		w.put(0x80|(v>>(6*i))&0x3F, 8)
	}
}

// bytes flushes the bits, zero-padded to a byte.
func (w *bitWriter) bytes() []byte {
	if w.nacc > 0 {
		w.put(0, 8-w.nacc)
	}
	return w.buf
}

func crc8(b []byte) byte {
	var c byte
	for _, v := range b {
		c ^= v
		for range 8 {
			if c&0x80 != 0 {
				c = c<<1 ^ 0x07
			} else {
				c <<= 1
			}
		}
	}
	return c
}

func crc16(b []byte) uint16 {
	var c uint16
	for _, v := range b {
		c ^= uint16(v) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x8005
			} else {
				c <<= 1
			}
		}
	}
	return c
}
