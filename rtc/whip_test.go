package rtc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pion/interceptor"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// pionAPI is a plain Pion setup, like OBS's or ffmpeg's WHIP/WHEP side: Opus, loopback.
func pionAPI(t *testing.T) *webrtc.API {
	me := &webrtc.MediaEngine{}
	if err := me.RegisterDefaultCodecs(); err != nil {
		t.Fatal(err)
	}
	ir := &interceptor.Registry{}
	if err := webrtc.RegisterDefaultInterceptors(me, ir); err != nil {
		t.Fatal(err)
	}
	se := webrtc.SettingEngine{}
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	return webrtc.NewAPI(webrtc.WithMediaEngine(me), webrtc.WithInterceptorRegistry(ir), webrtc.WithSettingEngine(se))
}

// routes serves srv's endpoints on the paths server/ gives them.
func routes(srv *rtc.Server) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	mux.HandleFunc("POST /v1/whip", srv.WHIP)
	mux.HandleFunc("DELETE /v1/whip/{id}", srv.WHIPDelete)
	mux.HandleFunc("POST /v1/whep/{session}", srv.WHEP)
	mux.HandleFunc("DELETE /v1/whep/{session}/{viewer}", srv.WHEPDelete)
	return mux
}

// postSDP does the WHIP/WHEP exchange: offer (all candidates) → 201 answer + Location.
// A key, if given, is sent as a Bearer token.
func postSDP(t *testing.T, pc *webrtc.PeerConnection, url string, key ...string) (string, int) {
	t.Helper()
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-gathered
	req, err := http.NewRequest("POST", url, strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/sdp")
	if len(key) > 0 {
		req.Header.Set("Authorization", "Bearer "+key[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return string(body), resp.StatusCode
	}
	if resp.Header.Get("Content-Type") != "application/sdp" {
		t.Errorf("answer Content-Type %q", resp.Header.Get("Content-Type"))
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("Location"), resp.StatusCode
}

// TestWHIPIngestWHEPEgress: a WHIP sender's speech is converted (dsp voice, pitch from the
// query) and a WHEP viewer receives it; DELETE ends both.
func TestWHIPIngestWHEPEgress(t *testing.T) {
	srv, err := rtc.NewServer(rtc.Config{Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := routes(srv)
	hs := httptest.NewServer(mux)
	defer func() { srv.Close(); hs.Close() }()
	api := pionAPI(t)

	// Bad offers get HTTP errors.
	for _, c := range []struct{ ct, body string }{{"text/plain", "v=0"}, {"application/sdp", "not sdp"}} {
		resp, err := http.Post(hs.URL+"/v1/whip", c.ct, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("%s %q: %d", c.ct, c.body, resp.StatusCode)
		}
	}

	// The sender: a sendonly Opus track, like OBS's WHIP output.
	send, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	track, err := webrtc.NewTrackLocalStaticSample(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2}, "audio", "obs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := send.AddTransceiverFromTrack(track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendonly}); err != nil {
		t.Fatal(err)
	}
	loc, code := postSDP(t, send, hs.URL+"/v1/whip?voice=dsp&pitch_semitones=4")
	if code != http.StatusCreated || !strings.HasPrefix(loc, "/v1/whip/") {
		t.Fatalf("whip: %d %q", code, loc)
	}
	session := strings.TrimPrefix(loc, "/v1/whip/")
	defer sendSpeechPackets(t, track)()

	// The viewer: recvonly, like OBS's WHEP source.
	view, heard := whepViewer(t, api)
	defer view.Close()
	stray, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	stray.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly})
	if _, code := postSDP(t, stray, hs.URL+"/v1/whep/nosuch"); code != http.StatusNotFound {
		t.Errorf("whep of an unknown session: %d", code)
	}
	stray.Close()
	vloc, code := postSDP(t, view, hs.URL+"/v1/whep/"+session)
	if code != http.StatusCreated || !strings.HasPrefix(vloc, "/v1/whep/"+session+"/") {
		t.Fatalf("whep: %d %q", code, vloc)
	}
	waitForSound(t, heard, 2*48000)
	if srv.Active() != 1 {
		t.Errorf("%d active sessions, want the WHIP one", srv.Active())
	}
	del := func(path string) int {
		req, _ := http.NewRequest(http.MethodDelete, hs.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := del(vloc); c != http.StatusOK {
		t.Errorf("DELETE viewer: %d", c)
	}
	if c := del(loc); c != http.StatusOK {
		t.Errorf("DELETE whip: %d", c)
	}
	if c := del(loc); c != http.StatusNotFound {
		t.Errorf("second DELETE: %d", c)
	}
	for end := time.Now().Add(5 * time.Second); srv.Active() != 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if srv.Active() != 0 {
		t.Errorf("session still active after DELETE")
	}
}

// sendSpeechPackets sends the speech fixture's Opus packets on track every 20 ms, looping,
// until the returned stop is called (which waits for the sender to end).
func sendSpeechPackets(t *testing.T, track *webrtc.TrackLocalStaticSample) (stop func()) {
	t.Helper()
	packets, err := rtcclient.EncodeFrames(speech(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			track.WriteSample(media.Sample{Data: packets[i%len(packets)], Duration: 20 * time.Millisecond})
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// whepViewer is a recvonly peer, like OBS's WHEP source, that decodes what it receives;
// heard returns a copy of the audio so far.
func whepViewer(t *testing.T, api *webrtc.API) (view *webrtc.PeerConnection, heard func() []float32) {
	t.Helper()
	view, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := view.AddTransceiverFromKind(webrtc.RTPCodecTypeAudio, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionRecvonly}); err != nil {
		t.Fatal(err)
	}
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
	return view, func() []float32 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// waitForSound waits up to 15 s for at least n samples whose last second has sound.
func waitForSound(t *testing.T, heard func() []float32, n int) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := heard()
		r := rmsOf(got[max(0, len(got)-48000):])
		if len(got) >= n && r > 0.01 {
			t.Logf("viewer received %d samples, last second RMS %.3f", len(got), r)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("viewer got %d samples, RMS %.4f", len(got), r)
		}
	}
}
