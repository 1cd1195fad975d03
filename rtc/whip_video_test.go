package rtc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
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

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	packets, err := rtcclient.EncodeFrames(speech(t))
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			audio.WriteSample(media.Sample{Data: packets[i%len(packets)], Duration: 20 * time.Millisecond})
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	})

	view, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	view.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly})
	var mu sync.Mutex
	var got []float32
	view.OnTrack(func(tr *webrtc.TrackRemote, _ *webrtc.RTPReceiver) {
		dec, _ := opus.NewDecoder(48000, 1)
		pcm := make([]float32, 5760)
		for {
			pkt, _, err := tr.ReadRTP()
			if err != nil {
				return
			}
			if n, err := dec.DecodeFloat32(pkt.Payload, pcm); err == nil {
				mu.Lock()
				got = append(got, pcm[:n]...)
				mu.Unlock()
			}
		}
	})
	session := strings.TrimPrefix(loc, "/v1/whip/")
	if _, code := postSDP(t, view, hs.URL+"/v1/whep/"+session); code != http.StatusCreated {
		t.Fatalf("whep: %d", code)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		n, r := len(got), rmsOf(got[max(0, len(got)-48000):])
		mu.Unlock()
		if n >= 48000 && r > 0.01 {
			t.Logf("viewer received %d samples, last second RMS %.3f", n, r)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("viewer got %d samples, RMS %.4f", n, r)
		}
	}
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
