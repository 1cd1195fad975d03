package auth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMiddleware(t *testing.T) {
	if _, err := NewKeys([]string{"short"}); err == nil {
		t.Error("short key accepted")
	}
	k, err := NewKeys([]string{"", "0123456789abcdef-one", "0123456789abcdef-two"})
	if err != nil || !k.Enabled() {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	h := k.Middleware(ok, func(p string) bool { return p == "/healthz" || !strings.HasPrefix(p, "/v1/") })
	for _, c := range []struct {
		path, header string
		want         int
	}{
		{"/v1/voices", "", 401},
		{"/v1/voices", "Bearer nope-nope-nope-nope", 401},
		{"/v1/voices", "Basic 0123456789abcdef-one", 401},
		{"/v1/voices", "Bearer 0123456789abcdef-one", 204},
		{"/v1/voices", "Bearer 0123456789abcdef-two", 204},
		{"/v1/tts/ws?token=0123456789abcdef-two", "", 204},
		{"/v1/tts/ws?token=0123456789abcdef-thr", "", 401},
		{"/healthz", "", 204},
		{"/", "", 204},
	} {
		r := httptest.NewRequest("GET", c.path, nil)
		if c.header != "" {
			r.Header.Set("Authorization", c.header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != c.want {
			t.Errorf("%s %q: %d, want %d", c.path, c.header, rec.Code, c.want)
		}
		if rec.Code == 401 && (!strings.Contains(rec.Body.String(), "unauthorized") || rec.Header().Get("WWW-Authenticate") == "") {
			t.Errorf("401 body %q", rec.Body.String())
		}
	}
	// No keys: everything passes.
	none, _ := NewKeys(nil)
	rec := httptest.NewRecorder()
	none.Middleware(ok, nil).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/voices", nil))
	if rec.Code != 204 {
		t.Errorf("no keys: %d", rec.Code)
	}
}

func TestRequired(t *testing.T) {
	none, _ := NewKeys(nil)
	some, _ := NewKeys([]string{"0123456789abcdef"})
	for _, c := range []struct {
		addr string
		keys *Keys
		ok   bool
	}{
		{"localhost:8080", none, true}, {"127.0.0.1:80", none, true}, {"[::1]:8080", none, true},
		{"0.0.0.0:8080", none, false}, {":8080", none, false}, {"192.168.1.5:8080", none, false},
		{"0.0.0.0:8080", some, true},
	} {
		if err := Required(c.addr, c.keys); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.addr, err)
		}
	}
}

func TestLimitSessions(t *testing.T) {
	k, _ := NewKeys([]string{"0123456789abcdef-one", "0123456789abcdef-two"})
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(204)
	})
	h := k.LimitSessions(slow, 2, func(p string) bool { return p == "/v1/tts/ws" })
	do := func(key string) int {
		r := httptest.NewRequest("GET", "/v1/tts/ws?token="+key, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	codes := make(chan int, 2)
	for range 2 {
		go func() { codes <- do("0123456789abcdef-one") }()
	}
	<-entered
	<-entered
	if c := do("0123456789abcdef-one"); c != http.StatusTooManyRequests {
		t.Errorf("third session of a key: %d", c)
	}
	go func() { codes <- do("0123456789abcdef-two") }() // another key is not limited by it
	<-entered
	close(release)
	for range 3 {
		if c := <-codes; c != 204 {
			t.Errorf("session: %d", c)
		}
	}
	if c := do("0123456789abcdef-one"); c != 204 {
		t.Errorf("after the others ended: %d", c)
	}
}
