package rtc

import (
	"fmt"
	"strings"

	"github.com/pion/sdp/v3"
)

// checkOffer makes sure an offer is SDP with an audio m-line that offers Opus, so a bad offer
// gets a precise error code instead of a generic negotiation failure.
func checkOffer(offer string) (code string, err error) {
	var d sdp.SessionDescription
	if err := d.UnmarshalString(offer); err != nil {
		return CodeBadSDP, fmt.Errorf("offer is not valid SDP: %v", err)
	}
	audio := 0
	for _, m := range d.MediaDescriptions {
		if m.MediaName.Media != "audio" {
			continue
		}
		audio++
		for _, a := range m.Attributes {
			if a.Key == "rtpmap" && strings.Contains(strings.ToLower(a.Value), "opus/48000") {
				return "", nil
			}
		}
	}
	if audio == 0 {
		return CodeNoAudio, fmt.Errorf("offer has no audio m-line: send one audio track")
	}
	return CodeUnsupportedCodec, fmt.Errorf("offer's audio does not offer Opus (opus/48000); voxpipe only speaks Opus")
}
