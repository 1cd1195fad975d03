package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandlerServesPage(t *testing.T) {
	h := Handler()
	cases := []struct {
		path, ctype, cache, contains string
	}{
		{"/", "text/html", "no-cache", `id="latency"`},
		{"/app.js", "text/javascript", "max-age", "window.voxpipe"},
		{"/style.css", "text/css", "max-age", "--bg"},
	}
	for _, c := range cases {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, c.path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: status %d", c.path, rec.Code)
		}
		if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, c.ctype) {
			t.Errorf("GET %s: Content-Type %q, want %s", c.path, got, c.ctype)
		}
		if got := rec.Header().Get("Cache-Control"); !strings.Contains(got, c.cache) {
			t.Errorf("GET %s: Cache-Control %q, want %s", c.path, got, c.cache)
		}
		if !strings.Contains(rec.Body.String(), c.contains) {
			t.Errorf("GET %s: body lacks %q", c.path, c.contains)
		}
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/missing.js", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET /missing.js: status %d, want 404", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: status %d, want 405", rec.Code)
	}
}
