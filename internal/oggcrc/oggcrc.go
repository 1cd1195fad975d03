// Package oggcrc is the checksum of Ogg pages (RFC 3533), shared by the Ogg writer
// (tts/audioout) and reader (dsp/audiofile).
package oggcrc

var table = func() (t [256]uint32) {
	for i := range t {
		r := uint32(i) << 24
		for range 8 {
			if r&0x80000000 != 0 {
				r = r<<1 ^ 0x04C11DB7
			} else {
				r <<= 1
			}
		}
		t[i] = r
	}
	return t
}()

// Update continues Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected, initial value 0)
// over b; a page's checksum is Update(0, page) with its checksum field zeroed.
func Update(c uint32, b []byte) uint32 {
	for _, x := range b {
		c = c<<8 ^ table[byte(c>>24)^x]
	}
	return c
}
