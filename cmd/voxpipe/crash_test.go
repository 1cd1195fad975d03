package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
	"github.com/voxpipe/voxpipe/tts"
)

// crashServer is a `voxpipe serve` child on a voices directory that a test may kill -9.
type crashServer struct {
	base string
	pid  int
	stop func()
}

func startCrashServer(t *testing.T, voices string, log *errorLines) crashServer {
	t.Helper()
	base, pid, stop, err := startServer(log, "--voices", voices, "--tts-model", golden.Path(t, "miotts", "model.gguf"),
		"--codec", golden.Path(t, "miocodec", "model.gguf"), "--tts-voice", fixture, "--tts-slots", "4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop) // after a kill it only reaps the process
	return crashServer{base, pid, stop}
}

func (s crashServer) kill(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(s.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.stop()
}

// postVoice uploads a clip: the id when the server acknowledged it (201), else the status
// it answered, or the transport error when there was no answer.
func postVoice(base, name string, clip []byte) (id string, status int, err error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("name", name)
	fw, _ := mw.CreateFormFile("file", name+".wav")
	fw.Write(clip)
	mw.Close()
	resp, err := soakHTTP.Post(base+"/v1/voices", mw.FormDataContentType(), &body)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var v struct{ ID string }
	if resp.StatusCode == http.StatusCreated && json.NewDecoder(resp.Body).Decode(&v) == nil {
		return v.ID, resp.StatusCode, nil
	}
	return "", resp.StatusCode, nil
}

// uploader keeps uploading from a few clients until the server goes away, and records
// what it acknowledged and any answer other than 201 (a killed server gives none).
type uploader struct {
	mu      sync.Mutex
	acked   map[string]string // id → name
	refused []string
	wg      sync.WaitGroup
}

func startUploads(base, prefix string, clip []byte) *uploader {
	u := &uploader{acked: map[string]string{}}
	for c := range 4 {
		u.wg.Go(func() {
			for i := 0; ; i++ {
				name := fmt.Sprintf("%s-%d-%d", prefix, c, i)
				id, status, err := postVoice(base, name, clip)
				if err != nil {
					return // the server is gone
				}
				u.mu.Lock()
				if id != "" {
					u.acked[id] = name
				} else {
					u.refused = append(u.refused, fmt.Sprintf("%s: %d", name, status))
				}
				u.mu.Unlock()
			}
		})
	}
	return u
}

func (u *uploader) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.acked)
}

// speakVoice speaks text with voice on a TTS socket, signals first (once) at its first
// audio, and returns the audio messages up to done, or the error that ended the socket.
func speakVoice(base, voice, text string, first chan<- struct{}) (int, error) {
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+"/v1/tts/ws", nil)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := conn.WriteJSON(map[string]any{"type": "speak", "context_id": "c", "text": text, "voice": voice,
		"options": map[string]any{"max_tokens": 40, "seed": 1}}); err != nil {
		return 0, err
	}
	audio := 0
	for {
		var m tts.ServerMessage
		if err := conn.ReadJSON(&m); err != nil {
			return audio, err
		}
		switch m.Type {
		case "audio":
			if audio++; audio == 1 && first != nil {
				first <- struct{}{}
			}
		case "error":
			return audio, fmt.Errorf("%s: %s", m.Code, m.Message)
		case "done":
			return audio, nil
		}
	}
}

// checkNoLeftovers checks a voices directory after a restart (the library's Open has run):
// no temporary files in it or in its embedding cache, every clip with its metadata and the
// other way round, every cached embedding whole, and every acknowledged voice served.
func checkNoLeftovers(t *testing.T, base, dir string, acked map[string]string) {
	t.Helper()
	names := func(d string) []string {
		es, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var n []string
		for _, e := range es {
			n = append(n, e.Name())
		}
		return n
	}
	files := map[string]bool{}
	for _, n := range names(dir) {
		files[n] = true
	}
	for n := range files {
		id, ext, _ := strings.Cut(n, ".")
		switch {
		case strings.HasPrefix(n, "."):
			t.Errorf("%s: temporary file left in the library after the restart", n)
		case ext == "wav" && !files[id+".json"]:
			t.Errorf("%s: clip without metadata left after the restart", n)
		case ext == "json" && !files[id+".wav"]:
			t.Errorf("%s: metadata without its clip", n)
		}
	}
	emb := filepath.Join(dir, "embeddings")
	for _, n := range names(emb) {
		if strings.HasPrefix(n, ".") {
			t.Errorf("embeddings/%s: temporary file left in the embedding cache after the restart", n)
			continue
		}
		// embcache's format: "VXEM", a uint32 count, then that many float32s.
		b, err := os.ReadFile(filepath.Join(emb, n))
		if err != nil || len(b) < 8 || string(b[:4]) != "VXEM" || len(b) != 8+4*int(binary.LittleEndian.Uint32(b[4:8])) {
			t.Errorf("embeddings/%s: not a whole embedding (%d bytes, %v)", n, len(b), err)
		}
	}
	for id, name := range acked {
		var v struct{ ID, Name string }
		if err := getJSON(base+"/v1/voices/"+id, &v); err != nil || v.Name != name {
			t.Errorf("acknowledged upload %s (%s) lost: %+v %v", id, name, v, err)
		}
	}
}

// TestKill9DuringUploadsAndTTS kills the server (SIGKILL) while clients upload voices, and
// again while TTS streams speak with voices just uploaded (their speaker embeddings being
// computed and written to the cache, more uploads going on). After each restart on the same
// directory every acknowledged upload is there and nothing half-written is left, and the
// voices still speak. Where in a write the kill lands is chance; what is checked holds for
// any moment.
func TestKill9DuringUploadsAndTTS(t *testing.T) {
	t.Setenv(actAsVoxpipe, "1")
	dir := t.TempDir()
	var logBuf bytes.Buffer
	log := &errorLines{w: &logBuf}
	defer func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("server logs:\n%s", logBuf.String())
		}
	}()
	clip, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]string{}
	keep := func(u *uploader) {
		u.wg.Wait()
		for id, n := range u.acked {
			acked[id] = n
		}
		if len(u.refused) > 0 {
			t.Errorf("uploads refused: %q", u.refused)
		}
	}

	// 1. Killed during uploads.
	s := startCrashServer(t, dir, log)
	u := startUploads(s.base, "a", clip)
	for deadline := time.Now().Add(30 * time.Second); u.count() < 12 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	s.kill(t)
	keep(u)
	if len(acked) < 12 {
		t.Fatalf("only %d uploads acknowledged before the kill", len(acked))
	}
	s = startCrashServer(t, dir, log)
	checkNoLeftovers(t, s.base, dir, acked)

	// 2. Killed during TTS: fresh voices (distinct audio, so each is embedded anew) speak at
	// once while uploads go on; the kill comes at the first audio.
	ref, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	var fresh []string
	for i := range 4 {
		scaled := slices.Clone(ref.Mono())
		for j := range scaled {
			scaled[j] *= 0.5 + 0.1*float32(i)
		}
		var b bytes.Buffer
		if err := wav.Write(&b, scaled, ref.SampleRate, 1); err != nil {
			t.Fatal(err)
		}
		id, status, err := postVoice(s.base, fmt.Sprintf("fresh-%d", i), b.Bytes())
		if id == "" {
			t.Fatalf("upload: %d %v", status, err)
		}
		acked[id] = fmt.Sprintf("fresh-%d", i)
		fresh = append(fresh, id)
	}
	u = startUploads(s.base, "b", clip)
	first := make(chan struct{}, len(fresh))
	var speakers sync.WaitGroup
	for i, id := range fresh {
		speakers.Go(func() {
			time.Sleep(time.Duration(i) * 15 * time.Millisecond)
			speakVoice(s.base, id, "Hello from a voice that was just uploaded.", first) // ends with the kill
		})
	}
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no TTS audio within 30 s")
	}
	s.kill(t)
	if es, err := os.ReadDir(filepath.Join(dir, "embeddings")); err == nil {
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		t.Logf("embedding cache at the kill: %q", names)
	}
	speakers.Wait()
	keep(u)
	s = startCrashServer(t, dir, log)
	checkNoLeftovers(t, s.base, dir, acked)
	for _, id := range fresh {
		if n, err := speakVoice(s.base, id, "Still here after the crash.", nil); err != nil || n == 0 {
			t.Errorf("voice %s after the restart: %d audio messages, %v", id, n, err)
		}
	}
	if n := log.count(); n > 0 {
		t.Errorf("%d ERROR lines in the server logs", n)
	}
	t.Logf("%d acknowledged uploads survived two kills", len(acked))
}
