// Package lktest runs LiveKit for tests and benchmarks: a livekit-server built from its Go
// module (once, into the user cache) and started on loopback, and participants that publish
// a microphone and record what they hear, with their arrival times.
package lktest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	lksdk "github.com/livekit/server-sdk-go/v2"
	"github.com/pion/webrtc/v4"
	"github.com/pion/webrtc/v4/pkg/media"
	"gopkg.in/hraban/opus.v2"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/rtc/rtcclient"
)

// liveKitVersion is the livekit-server the tests run: the newest release whose module builds
// from the Go module proxy alone (later ones replace pion modules with forks it does not
// serve).
const liveKitVersion = "v1.13.5"

// Binary is a livekit-server built from its Go module into the user cache (once per
// machine), or $VOXPIPE_LIVEKIT_SERVER. The tests skip, saying why, only if it cannot be
// built.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("VOXPIPE_LIVEKIT_SERVER"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "voxpipe", "test-tools", "livekit-server-"+liveKitVersion)
	bin := filepath.Join(dir, "server")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	t.Logf("building livekit-server %s from its Go module into %s (once; a few minutes)…", liveKitVersion, dir)
	cmd := exec.Command("go", "install", "github.com/livekit/livekit-server/cmd/server@"+liveKitVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		tail := string(out)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		t.Skipf("cannot build livekit-server %s from its Go module, so the LiveKit tests cannot run: %v\n%s", liveKitVersion, err, tail)
	}
	return bin
}

// Server is a livekit-server a test started on loopback.
type Server struct {
	URL, Key, Secret string
}

// HTTPURL is the server's URL for its HTTP APIs (room service, dispatch).
func (s Server) HTTPURL() string { return strings.Replace(s.URL, "ws://", "http://", 1) }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func freeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// Start runs a single-node livekit-server until the test ends.
func Start(t testing.TB) Server {
	t.Helper()
	bin := Binary(t)
	lk := Server{Key: "APIvoxpipetest", Secret: "voxpipe-test-secret-0123456789abcdef0123"}
	port := freePort(t)
	cfg := fmt.Sprintf(`port: %d
bind_addresses: ["127.0.0.1"]
rtc:
  tcp_port: %d
  udp_port: %d
  use_external_ip: false
keys:
  %s: %s
logging:
  level: warn
`, port, freePort(t), freeUDPPort(t), lk.Key, lk.Secret)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "livekit.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "livekit.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "livekit.yaml"), "--node-ip", "127.0.0.1")
	cmd.Stdout, cmd.Stderr = logf, logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("livekit-server log:\n%s", b)
			}
		}
	})
	lk.URL = fmt.Sprintf("ws://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return lk
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("livekit-server exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("livekit-server did not answer within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Participant is a test client in a LiveKit room: it can publish a microphone and records
// the audio of the tracks it subscribes to, and the data messages it gets.
type Participant struct {
	Room *lksdk.Room

	mu     sync.Mutex
	tracks map[string]*rtcclient.Received // by track name
	data   [][]byte
	subbed chan string // names of newly subscribed tracks
}

// Join connects a participant to a room until the test ends.
func Join(t testing.TB, lk Server, room, identity string) *Participant {
	t.Helper()
	p := &Participant{tracks: map[string]*rtcclient.Received{}, subbed: make(chan string, 16)}
	cb := lksdk.NewRoomCallback()
	cb.OnTrackSubscribed = func(tr *webrtc.TrackRemote, pub *lksdk.RemoteTrackPublication, _ *lksdk.RemoteParticipant) {
		if tr.Kind() != webrtc.RTPCodecTypeAudio {
			return
		}
		p.subbed <- pub.Name()
		go p.record(tr, pub.Name())
	}
	cb.OnDataPacket = func(d lksdk.DataPacket, _ lksdk.DataReceiveParams) {
		if u, ok := d.(*lksdk.UserDataPacket); ok && u.Topic == "voxpipe" {
			p.mu.Lock()
			p.data = append(p.data, u.Payload)
			p.mu.Unlock()
		}
	}
	r, err := lksdk.ConnectToRoom(lk.URL, lksdk.ConnectInfo{APIKey: lk.Key, APISecret: lk.Secret, RoomName: room, ParticipantIdentity: identity}, cb)
	if err != nil {
		t.Fatalf("%s cannot join %s: %v", identity, room, err)
	}
	p.Room = r
	t.Cleanup(r.Disconnect)
	return p
}

func (p *Participant) record(tr *webrtc.TrackRemote, name string) {
	dec, err := opus.NewDecoder(48000, 1)
	if err != nil {
		return
	}
	pcm := make([]float32, 5760)
	for {
		pkt, _, err := tr.ReadRTP()
		if err != nil {
			return
		}
		n, err := dec.DecodeFloat32(pkt.Payload, pcm)
		if err != nil {
			continue
		}
		at := time.Now()
		p.mu.Lock()
		r := p.tracks[name]
		if r == nil {
			r = &rtcclient.Received{}
			p.tracks[name] = r
		}
		r.Packets = append(r.Packets, rtcclient.ReceivedPacket{At: at, Start: len(r.PCM), N: n})
		r.PCM = append(r.PCM, pcm[:n]...)
		p.mu.Unlock()
	}
}

// Audio is what has come in on the named track so far.
func (p *Participant) Audio(name string) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.tracks[name]; r != nil {
		return append([]float32(nil), r.PCM...)
	}
	return nil
}

// Received is what has come in on the named track so far, with each packet's arrival.
func (p *Participant) Received(name string) rtcclient.Received {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.tracks[name]
	if r == nil {
		return rtcclient.Received{}
	}
	return rtcclient.Received{PCM: append([]float32(nil), r.PCM...), Packets: append([]rtcclient.ReceivedPacket(nil), r.Packets...)}
}

// WaitTrack waits for a subscription to the named track.
func (p *Participant) WaitTrack(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	if !p.AwaitTrack(name, timeout) {
		t.Fatalf("no track %q within %v", name, timeout)
	}
}

// AwaitTrack waits for a subscription to the named track, and says whether it came.
func (p *Participant) AwaitTrack(name string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		select {
		case got := <-p.subbed:
			if got == name {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// Microphone is a published Opus track.
type Microphone struct{ track *lksdk.LocalTrack }

// Microphone publishes an Opus track named mic.
func (p *Participant) Microphone(t testing.TB) Microphone {
	t.Helper()
	tr, err := lksdk.NewLocalSampleTrack(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: 48000, Channels: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Room.LocalParticipant.PublishTrack(tr, &lksdk.TrackPublicationOptions{Name: "mic"}); err != nil {
		t.Fatal(err)
	}
	return Microphone{tr}
}

// Speak sends pcm as 20 ms Opus frames paced like a microphone, and returns when each frame
// was sent.
func (m Microphone) Speak(ctx context.Context, pcm []float32) ([]time.Time, error) {
	packets, err := rtcclient.EncodeFrames(pcm)
	if err != nil {
		return nil, err
	}
	times := make([]time.Time, 0, len(packets))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i, pkt := range packets {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return times, ctx.Err()
			}
		}
		times = append(times, time.Now())
		if err := m.track.WriteSample(media.Sample{Data: pkt, Duration: 20 * time.Millisecond}, nil); err != nil {
			return times, err
		}
	}
	return times, nil
}

// Speech is the committed espeak-ng fixture (48 kHz mono).
func Speech(t testing.TB) []float32 {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	a, err := wav.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "testdata", "speech_en_48k.wav"))
	if err != nil {
		t.Fatal(err)
	}
	return a.Mono()
}

// Eventually waits up to timeout for ok.
func Eventually(t testing.TB, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Event is the last data message of that type and context id, or nil.
func (p *Participant) Event(typ, id string) *rtc.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.data) - 1; i >= 0; i-- {
		var m rtc.Message
		if json.Unmarshal(p.data[i], &m) == nil && m.Type == typ && m.ContextID == id {
			return &m
		}
	}
	return nil
}
