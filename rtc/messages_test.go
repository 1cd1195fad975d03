package rtc

import (
	"testing"
)

func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"offer","sdp":"v=0"}`, `{"type":"candidate","candidate":{"candidate":"x","sdpMid":"0"}}`,
		`{"type":"session","mode":"vc","voice":"dsp","params":{"pitch_semitones":4}}`,
		`{"type":"session","passthrough":true}`, `{"type":1}`, `[]`, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, code, err := decodeMessage(data)
		if err != nil {
			if code == "" {
				t.Fatalf("error %v without a code", err)
			}
			return
		}
		if m.Type == "" {
			t.Fatal("accepted a message without a type")
		}
	})
}

func FuzzCheckOffer(f *testing.F) {
	f.Add("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n")
	f.Add("v=0\r\nm=video 9 RTP/AVP 96\r\n")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, sdp string) {
		code, err := checkOffer(sdp)
		if (err == nil) != (code == "") {
			t.Fatalf("code %q with error %v", code, err)
		}
	})
}

func TestCheckOffer(t *testing.T) {
	ok := "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n"
	if code, err := checkOffer(ok); err != nil {
		t.Fatalf("valid offer rejected: %s %v", code, err)
	}
	video := "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n"
	if code, _ := checkOffer(video); code != CodeNoAudio {
		t.Fatalf("video-only offer: code %q, want %q", code, CodeNoAudio)
	}
	g722 := "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 9\r\na=rtpmap:9 G722/8000\r\n"
	if code, _ := checkOffer(g722); code != CodeUnsupportedCodec {
		t.Fatalf("G.722 offer: code %q, want %q", code, CodeUnsupportedCodec)
	}
}
