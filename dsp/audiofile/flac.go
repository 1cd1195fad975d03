package audiofile

import (
	"fmt"
	"io"

	"github.com/mewkiz/flac"
	"github.com/mewkiz/flac/frame"
)

// readFLAC decodes a native FLAC stream ("fLaC" first) with github.com/mewkiz/flac, which
// skips metadata blocks without reading them into memory and decodes one frame (at most
// 65535 samples a channel) at a time.
func readFLAC(r io.Reader, lim Limits) (*Audio, error) {
	var st *flac.Stream
	if err := try(FLAC, func() (err error) { st, err = flac.New(r); return err }); err != nil {
		return nil, fmt.Errorf("%w: FLAC header: %w", ErrCorrupt, err)
	}
	info := st.Info
	bps := int(info.BitsPerSample)
	switch bps {
	case 8, 12, 16, 20, 24:
		// The sizes a frame header can state; other sizes make every frame say "see the
		// stream info", which the decoder does not follow.
	default:
		return nil, fmt.Errorf("%w: FLAC of %d bits per sample (8, 12, 16, 20 or 24 are decoded)", ErrUnsupported, bps)
	}
	ch := int(info.NChannels)
	s, err := newSink(FLAC, int(info.SampleRate), ch, lim)
	if err != nil {
		return nil, err
	}
	scale := 1 / float32(int64(1)<<(bps-1))
	var pcm []float32
	for {
		var f *frame.Frame
		err := try(FLAC, func() (err error) { f, err = st.ParseNext(); return err })
		if err == io.EOF {
			break
		}
		if err == nil {
			err = checkFLACFrame(f, ch, bps)
		}
		if err != nil {
			if err := s.stop(fmt.Errorf("%w: FLAC frame: %w", ErrCorrupt, err)); err != nil {
				return nil, err
			}
			break
		}
		n := int(f.BlockSize)
		pcm = pcm[:0]
		for i := range n {
			for c := range ch {
				pcm = append(pcm, float32(f.Subframes[c].Samples[i])*scale)
			}
		}
		if err := s.add(pcm); err != nil {
			return nil, err
		}
	}
	return s.finish()
}

// checkFLACFrame checks that a decoded frame matches the stream: its channels, its sample
// size and a full block of samples in every subframe.
func checkFLACFrame(f *frame.Frame, ch, bps int) error {
	if got := f.Channels.Count(); got != ch || len(f.Subframes) != ch {
		return fmt.Errorf("frame of %d channels in a %d-channel stream", got, ch)
	}
	if int(f.BitsPerSample) != bps {
		return fmt.Errorf("frame of %d bits per sample in a %d-bit stream", f.BitsPerSample, bps)
	}
	for _, sf := range f.Subframes {
		if sf == nil || len(sf.Samples) != int(f.BlockSize) {
			return fmt.Errorf("subframe does not hold the frame's %d samples", f.BlockSize)
		}
	}
	return nil
}
