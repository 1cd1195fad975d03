package rtc

import (
	"fmt"

	"gopkg.in/hraban/opus.v2"
)

const (
	opusRate   = 48000
	frameMs    = 20
	frameSize  = opusRate * frameMs / 1000 // samples per 20 ms frame
	maxPacket  = 1500
	maxFrameMs = 120 // the longest Opus packet
)

// EncoderConfig tunes the Opus encoder of the outgoing track.
type EncoderConfig struct {
	Bitrate    int // bits/s; default 32000
	Complexity int // 0–10; default 5 (plenty for voice, half the cost of 10)
	LossPerc   int // expected loss for in-band FEC; default 10
}

func newEncoder(c EncoderConfig) (*opus.Encoder, error) {
	if c.Bitrate == 0 {
		c.Bitrate = 32000
	}
	if c.Complexity == 0 {
		c.Complexity = 5
	}
	if c.LossPerc == 0 {
		c.LossPerc = 10
	}
	enc, err := opus.NewEncoder(opusRate, 1, opus.AppVoIP)
	if err != nil {
		return nil, fmt.Errorf("opus encoder: %w", err)
	}
	for _, set := range []error{
		enc.SetBitrate(c.Bitrate),
		enc.SetComplexity(c.Complexity),
		enc.SetInBandFEC(true),
		enc.SetPacketLossPerc(c.LossPerc),
	} {
		if set != nil {
			return nil, fmt.Errorf("opus encoder: %w", set)
		}
	}
	return enc, nil
}
