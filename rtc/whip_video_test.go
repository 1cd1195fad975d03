package rtc_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"

	"github.com/voxpipe/voxpipe/rtc"
)

// TestWHIPAudioVideoOfferLikeOBS: OBS's WHIP output offers H.264 video as well as Opus
// audio. The server rejects the video section (port 0), converts the audio, and a WHEP
// viewer hears it. (Pion cannot play OBS here: it treats a rejected section of its own as
// an error and starts no track, so the offer gets OBS's video section added on the wire.)
func TestWHIPAudioVideoOfferLikeOBS(t *testing.T) {
	srv, err := rtc.NewServer(rtc.Config{Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(routes(srv))
	defer func() { srv.Close(); hs.Close() }()
	api := pionAPI(t)

	send, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	audio, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "obs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := send.AddTransceiverFromTrack(audio, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendonly}); err != nil {
		t.Fatal(err)
	}
	offer, err := send.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(send)
	if err := send.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-gathered
	resp, err := http.Post(hs.URL+"/v1/whip?voice=dsp&pitch_semitones=4", "application/sdp", strings.NewReader(withVideo(t, send.LocalDescription().SDP)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("whip with audio and video: %d %s", resp.StatusCode, body)
	}
	loc := resp.Header.Get("Location")
	var answer sdp.SessionDescription
	if err := answer.UnmarshalString(string(body)); err != nil {
		t.Fatal(err)
	}
	if len(answer.MediaDescriptions) != 2 {
		t.Fatalf("the answer has %d media sections, want audio and video:\n%s", len(answer.MediaDescriptions), body)
	}
	for _, m := range answer.MediaDescriptions {
		switch m.MediaName.Media {
		case "video":
			if m.MediaName.Port.Value != 0 {
				t.Errorf("the answer accepts video: %v", m.MediaName)
			}
		case "audio":
			if m.MediaName.Port.Value == 0 {
				t.Errorf("the answer rejects audio: %v", m.MediaName)
			}
		}
	}

	// The sender itself has no video section: it takes the answer without it.
	audioOnly := string(body)[:strings.Index(string(body), "m=video")]
	if err := send.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: audioOnly}); err != nil {
		t.Fatal(err)
	}

	defer sendSpeechPackets(t, audio)()
	view, heard := whepViewer(t, api)
	defer view.Close()
	session := strings.TrimPrefix(loc, "/v1/whip/")
	if _, code := postSDP(t, view, hs.URL+"/v1/whep/"+session); code != http.StatusCreated {
		t.Fatalf("whep: %d", code)
	}
	waitForSound(t, heard, 48000)
}

// withVideo adds a sendonly H.264 video section to an audio-only offer, bundled with the
// audio and sharing its transport, as OBS's offer has.
func withVideo(t *testing.T, offer string) string {
	t.Helper()
	var ice []string
	for _, line := range strings.Split(offer, "\r\n") {
		for _, key := range []string{"a=ice-ufrag:", "a=ice-pwd:", "a=fingerprint:", "a=setup:"} {
			if strings.HasPrefix(line, key) {
				ice = append(ice, line)
			}
		}
	}
	if !strings.Contains(offer, "a=group:BUNDLE 0\r\n") || len(ice) < 3 {
		t.Fatalf("unexpected offer layout:\n%s", offer)
	}
	offer = strings.Replace(offer, "a=group:BUNDLE 0\r\n", "a=group:BUNDLE 0 1\r\n", 1)
	video := []string{"m=video 9 UDP/TLS/RTP/SAVPF 96", "c=IN IP4 0.0.0.0", "a=mid:1", "a=sendonly", "a=rtcp-mux",
		"a=rtpmap:96 H264/90000", "a=fmtp:96 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f",
		"a=ssrc:1234 cname:obs"}
	return offer + strings.Join(append(video[:4:4], append(ice, video[4:]...)...), "\r\n") + "\r\n"
}
