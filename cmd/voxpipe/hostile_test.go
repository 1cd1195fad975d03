package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestServeKeylessGuard: a server without keys trusts whoever reaches it, so it answers only
// to loopback host names (a DNS-rebound evil.example gets 421) and refuses state-changing
// requests from other origins (a cross-site form post gets 403).
func TestServeKeylessGuard(t *testing.T) {
	base := testApp(t, serveOptions{})
	do := func(method, path, host, origin string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader("name=x"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, path, host, origin string
		want                       int
	}{
		{"GET", "/", "", "", 200},
		{"GET", "/v1/voices", "localhost:8080", "", 200},
		{"GET", "/", "evil.example:8080", "", 421},
		{"GET", "/v1/voices", "evil.example", "", 421},
		{"POST", "/v1/voices", "", "http://evil.example", 403},
		{"DELETE", "/v1/voices/v_0123456789abcdef", "", "http://evil.example", 403},
		{"POST", "/v1/audio/speech", "", "http://evil.example", 403},
		{"POST", "/v1/voices", "", "", 400}, // no Origin (curl): reaches the handler, which wants multipart
	} {
		if got := do(c.method, c.path, c.host, c.origin); got != c.want {
			t.Errorf("%s %s host %q origin %q: %d, want %d", c.method, c.path, c.host, c.origin, got, c.want)
		}
	}
}
