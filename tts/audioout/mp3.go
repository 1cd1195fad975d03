package audioout

/*
#cgo LDFLAGS: -lmp3lame
#include <lame/lame.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// mp3Rates are the rates MPEG-1/2 layer III carries that a client may ask for.
var mp3Rates = []int{8000, 16000, 22050, 24000, 44100, 48000}

// mp3Encoder is a mono CBR MP3 stream through Debian's libmp3lame. A stream of frames needs
// no header: chunks concatenate to a playable .mp3.
type mp3Encoder struct {
	gf  C.lame_t
	out []byte
}

func newMP3Encoder(rate, kbps int) (*mp3Encoder, error) {
	gf := C.lame_init()
	if gf == nil {
		return nil, fmt.Errorf("mp3 encoder: lame_init failed")
	}
	C.lame_set_in_samplerate(gf, C.int(rate))
	C.lame_set_out_samplerate(gf, C.int(rate))
	C.lame_set_num_channels(gf, 1)
	C.lame_set_mode(gf, C.MONO)
	C.lame_set_brate(gf, C.int(kbps))
	C.lame_set_quality(gf, 5) // lame's default speed/quality balance
	C.lame_set_bWriteVbrTag(gf, 0)
	if C.lame_init_params(gf) < 0 {
		C.lame_close(gf)
		return nil, fmt.Errorf("mp3 encoder: lame rejects %d Hz mono at %d kbps", rate, kbps)
	}
	e := &mp3Encoder{gf: gf}
	runtime.SetFinalizer(e, (*mp3Encoder).close)
	return e, nil
}

// encode appends the MP3 frames x completes (flush: and the rest, padded) to dst.
func (e *mp3Encoder) encode(dst []byte, x []float32, flush bool) ([]byte, error) {
	if e.gf == nil {
		return dst, fmt.Errorf("mp3 encode: the encoder is closed")
	}
	// lame's worst case: 1.25·samples + 7200 bytes.
	need := len(x)*5/4 + 7200
	if cap(e.out) < need {
		e.out = make([]byte, need)
	}
	out := e.out[:need]
	n := C.int(0)
	if len(x) > 0 {
		pcm := (*C.float)(unsafe.Pointer(&x[0]))
		n = C.lame_encode_buffer_ieee_float(e.gf, pcm, pcm, C.int(len(x)), (*C.uchar)(unsafe.Pointer(&out[0])), C.int(len(out)))
		runtime.KeepAlive(x)
		if n < 0 {
			return dst, fmt.Errorf("mp3 encode: lame error %d", int(n))
		}
	}
	dst = append(dst, out[:n]...)
	if flush {
		m := C.lame_encode_flush(e.gf, (*C.uchar)(unsafe.Pointer(&out[0])), C.int(len(out)))
		if m < 0 {
			return dst, fmt.Errorf("mp3 flush: lame error %d", int(m))
		}
		dst = append(dst, out[:m]...)
	}
	return dst, nil
}

func (e *mp3Encoder) close() {
	if e.gf != nil {
		C.lame_close(e.gf)
		e.gf = nil
	}
}
