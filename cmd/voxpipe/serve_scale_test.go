package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voxpipe/voxpipe/dsp/wav"
	"github.com/voxpipe/voxpipe/internal/golden"
)

// keyed sends a request with an API key and returns the status and the body.
func keyed(method, url, key string, body io.Reader, contentType string) (int, []byte, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := soakHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// uploadKeyed posts a clip to base's voice library as key: the stored entry's JSON on 201.
func uploadKeyed(base, key, name string, clip []byte) (int, map[string]any, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("name", name)
	fw, _ := mw.CreateFormFile("file", "clip.wav")
	fw.Write(clip)
	mw.Close()
	code, b, err := keyed("POST", base+"/v1/voices", key, &body, mw.FormDataContentType())
	var v map[string]any
	if err == nil && code == http.StatusCreated {
		err = json.Unmarshal(b, &v)
	}
	return code, v, err
}

// listKeyed is GET /v1/voices' library entries for key, by id, and their names in order.
func listKeyed(t *testing.T, base, key string) (map[string]map[string]any, []string) {
	t.Helper()
	code, b, err := keyed("GET", base+"/v1/voices", key, nil, "")
	if err != nil || code != 200 {
		t.Fatalf("list %s: %d %v %s", base, code, err, b)
	}
	var list struct{ Voices []map[string]any }
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	byID := map[string]map[string]any{}
	var names []string
	for _, v := range list.Voices {
		byID[v["id"].(string)] = v
		names = append(names, v["name"].(string))
	}
	return byID, names
}

// speechClips makes n distinct real clips: the speech fixture at different gains.
func speechClips(t *testing.T, n int) [][]byte {
	t.Helper()
	ref, err := wav.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for i := range n {
		x := slices.Clone(ref.Mono())
		for j := range x {
			x[j] *= 0.3 + 0.05*float32(i)
		}
		var b bytes.Buffer
		if err := wav.Write(&b, x, ref.SampleRate, 1); err != nil {
			t.Fatal(err)
		}
		out = append(out, b.Bytes())
	}
	return out
}

// TestTwoServersShareVoiceLibrary: two `voxpipe serve` processes on one --voices directory
// (as two replicas on a shared volume), uploads and deletes through both at once with two
// client keys. Every acknowledged upload not deleted is listed by both servers with the
// same metadata, fetched and spoken with by both; every delete is gone from both; racing
// uploads of one name for one key store it once; racing deletes of one voice succeed once;
// the other key sees none of it.
func TestTwoServersShareVoiceLibrary(t *testing.T) {
	t.Setenv(actAsVoxpipe, "1")
	const (
		keyA  = "scale-client-key-A-0123456789"
		keyB  = "scale-client-key-B-0123456789"
		admin = "scale-admin-key-0123456789ab"
	)
	dir := t.TempDir()
	var logBuf bytes.Buffer
	log := &errorLines{w: &logBuf}
	defer func() {
		if t.Failed() {
			t.Logf("server logs:\n%s", logBuf.String())
		}
	}()
	var bases [2]string
	for i := range bases {
		base, _, stop, err := startServer(log, "--voices", dir, "--api-key", keyA+","+keyB, "--admin-key", admin,
			"--tts-model", golden.Path(t, "miotts", "model.gguf"), "--codec", golden.Path(t, "miocodec", "model.gguf"),
			"--tts-voice", fixture, "--tts-slots", "2", "--threads", "1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		bases[i] = base
	}
	clips := speechClips(t, 8)

	// 1. One name for one key, uploaded through both servers at once: stored once.
	var wg sync.WaitGroup
	codes := make([]int, 6)
	for i := range codes {
		wg.Go(func() {
			var err error
			if codes[i], _, err = uploadKeyed(bases[i%2], keyA, "Narrator", clips[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	slices.Sort(codes)
	if !slices.Equal(codes, []int{201, 409, 409, 409, 409, 409}) {
		t.Errorf("racing uploads of one name: %v, want one 201 and the rest 409", codes)
	}
	if code, _, err := uploadKeyed(bases[1], keyB, "Narrator", clips[0]); err != nil || code != 201 {
		t.Errorf("the other key's Narrator: %d %v", code, err)
	}

	// 2. Uploads through both servers, each worker deleting some of its key's voices
	// through the other server as it goes.
	type entry struct {
		v   map[string]any
		key string
		via int // the server that stored it
	}
	var mu sync.Mutex
	acked := map[string]entry{}
	deleted := map[string]bool{}
	for w := range 4 {
		wg.Go(func() {
			key := []string{keyA, keyB}[w/2]
			srv := w % 2
			for i := range 6 {
				code, v, err := uploadKeyed(bases[srv], key, fmt.Sprintf("w%d-%d", w, i), clips[(w+i)%len(clips)])
				if err != nil || code != 201 {
					t.Errorf("upload w%d-%d: %d %v", w, i, code, err)
					continue
				}
				id := v["id"].(string)
				mu.Lock()
				acked[id] = entry{v, key, srv}
				var victim string
				if i%2 == 1 { // delete the previous one, through the other server
					for oid, e := range acked {
						if e.key == key && e.via == srv && oid != id && !deleted[oid] {
							victim = oid
							deleted[oid] = true
							break
						}
					}
				}
				mu.Unlock()
				if victim != "" {
					if code, b, err := keyed("DELETE", bases[1-srv]+"/v1/voices/"+victim, key, nil, ""); err != nil || code != 204 {
						t.Errorf("delete %s through the other server: %d %v %s", victim, code, err, b)
					}
				}
			}
		})
	}
	wg.Wait()

	// 3. One voice deleted through both servers at once: one 204, one 404.
	var target string
	mu.Lock()
	for id, e := range acked {
		if !deleted[id] && e.key == keyB {
			target = id
			deleted[id] = true
			break
		}
	}
	mu.Unlock()
	var delCodes [2]int
	for i := range delCodes {
		wg.Go(func() {
			delCodes[i], _, _ = keyed("DELETE", bases[i]+"/v1/voices/"+target, keyB, nil, "")
		})
	}
	wg.Wait()
	if !(delCodes[0] == 204 && delCodes[1] == 404 || delCodes[0] == 404 && delCodes[1] == 204) {
		t.Errorf("racing deletes of %s: %v, want one 204 and one 404", target, delCodes)
	}

	// 4. Both servers agree, key by key.
	for _, key := range []string{keyA, keyB} {
		other := map[string]string{keyA: keyB, keyB: keyA}[key]
		var lists [2]map[string]map[string]any
		for s, base := range bases {
			byID, names := listKeyed(t, base, key)
			lists[s] = byID
			sorted := slices.Sorted(slices.Values(names))
			if len(slices.Compact(sorted)) != len(names) {
				t.Errorf("server %d lists duplicate names for one key: %q", s, names)
			}
			for id, e := range acked {
				got, listed := byID[id]
				switch {
				case e.key != key:
					if listed {
						t.Errorf("server %d lists another key's voice %s", s, id)
					}
				case deleted[id]:
					if listed {
						t.Errorf("server %d lists deleted voice %s", s, id)
					}
					if code, _, _ := keyed("GET", base+"/v1/voices/"+id, key, nil, ""); code != 404 {
						t.Errorf("server %d: GET of deleted %s: %d", s, id, code)
					}
				case !listed:
					t.Errorf("server %d lost acknowledged upload %v", s, e.v)
				default:
					if fmt.Sprint(got) != fmt.Sprint(e.v) {
						t.Errorf("server %d lists %v, the upload answered %v", s, got, e.v)
					}
					code, b, _ := keyed("GET", base+"/v1/voices/"+id, key, nil, "")
					var one map[string]any
					json.Unmarshal(b, &one)
					if code != 200 || fmt.Sprint(one) != fmt.Sprint(e.v) {
						t.Errorf("server %d: GET %s: %d %s", s, id, code, b)
					}
					if code, _, _ := keyed("GET", base+"/v1/voices/"+id, other, nil, ""); code != 404 {
						t.Errorf("server %d: the other key's GET of %s: %d, want 404", s, id, code)
					}
				}
			}
		}
		if fmt.Sprint(lists[0]) != fmt.Sprint(lists[1]) {
			t.Errorf("the servers list different voices for one key:\n%v\n%v", lists[0], lists[1])
		}
	}
	adm0, _ := listKeyed(t, bases[0], admin)
	adm1, _ := listKeyed(t, bases[1], admin)
	if want := len(acked) + 2 - len(deleted); len(adm0) != want || fmt.Sprint(adm0) != fmt.Sprint(adm1) {
		t.Errorf("admin listings: %d and %d voices, want %d on both", len(adm0), len(adm1), want)
	}

	// 5. A voice stored by one server speaks through the other; a deleted one is unknown.
	speak := func(base, key, voice string) (int, int) {
		code, b, err := keyed("POST", base+"/v1/audio/speech", key,
			strings.NewReader(`{"input":"Hello from the shared library.","voice":"`+voice+`","response_format":"pcm","options":{"max_tokens":16,"seed":1}}`),
			"application/json")
		if err != nil {
			t.Fatal(err)
		}
		return code, len(b)
	}
	spoken := 0
	for id, e := range acked {
		if deleted[id] || spoken == 2 || e.via != spoken {
			continue
		}
		if code, n := speak(bases[1-e.via], e.key, id); code != 200 || n == 0 {
			t.Errorf("voice %s (stored by server %d) through server %d: %d, %d bytes", id, e.via, 1-e.via, code, n)
		}
		spoken++
	}
	if spoken != 2 {
		t.Errorf("spoke with %d voices, want one stored by each server", spoken)
	}
	for s := range bases {
		if code, _ := speak(bases[s], keyB, target); code != 400 {
			t.Errorf("server %d speaks with deleted voice %s: %d", s, target, code)
		}
	}
	if n := log.count(); n > 0 {
		t.Errorf("%d ERROR lines in the server logs", n)
	}
	files, _ := os.ReadDir(dir)
	t.Logf("%d uploads acknowledged, %d deleted; %d entries in the directory", len(acked)+2, len(deleted), len(files))
}

// TestServeReadinessDuringShutdown: /readyz is 200 while serving and 503 "draining" from the
// moment a shutdown begins; for --drain-delay everything else is still served (the liveness
// check, keyed API requests, new connections), then the server stops within the grace
// period. /readyz and /v1/capacity need no key.
func TestServeReadinessDuringShutdown(t *testing.T) {
	const key = "ready-client-key-0123456789"
	const drain, grace = 1500 * time.Millisecond, time.Second
	s := startServe(t, serveOptions{apiKeys: []string{key}, drainDelay: drain, shutdownGrace: grace})
	base := "http://" + s.addr
	get := func(path, key string) (int, map[string]any) {
		code, b, err := keyed("GET", base+path, key, nil, "")
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		var v map[string]any
		json.Unmarshal(b, &v)
		return code, v
	}
	if code, v := get("/readyz", ""); code != 200 || v["status"] != "ok" {
		t.Fatalf("/readyz while serving: %d %v", code, v)
	}
	if code, v := get("/v1/capacity", ""); code != 200 || v["accepting"] != true || v["sessions"] != 0.0 {
		t.Fatalf("/v1/capacity: %d %v", code, v)
	}
	if code, _ := get("/v1/voices", ""); code != 401 {
		t.Fatalf("/v1/voices without a key: %d", code)
	}

	start := time.Now()
	s.cancel()
	for {
		code, v := get("/readyz", "")
		if code == 503 && v["status"] == "draining" {
			break
		}
		if time.Since(start) > drain/2 {
			t.Fatalf("/readyz %d %v %v after the shutdown began", code, v, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("/readyz turned 503 %v after the shutdown began", time.Since(start).Round(time.Millisecond))
	if code, _ := get("/healthz", ""); code != 200 {
		t.Errorf("/healthz while draining: %d", code)
	}
	if code, _ := get("/v1/voices", key); code != 200 {
		t.Errorf("keyed request while draining: %d", code)
	}
	if code, v := get("/v1/capacity", ""); code != 200 || v["accepting"] != false || v["status"] != "draining" {
		t.Errorf("/v1/capacity while draining: %d %v", code, v)
	}
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(drain + grace + 2*time.Second):
		t.Fatal("the server did not stop after the drain delay and grace period")
	}
	took := time.Since(start)
	if took < drain {
		t.Errorf("stopped %v after the shutdown began, before the %v drain delay", took, drain)
	}
	if _, err := http.Get(base + "/readyz"); err == nil {
		t.Error("still answering after the shutdown")
	}
	t.Logf("stopped %v after the shutdown began (drain %v, grace %v)", took.Round(time.Millisecond), drain, grace)
}
