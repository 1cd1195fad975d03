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
	k, _ := NewKeys([]string{"0123456789abcdef-one", "0123456789abcdef-two"}, "0123456789abcdef-adm")
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(204)
	})
	h := k.Middleware(NewSessionLimit(2).Middleware(slow, func(p string) bool { return p == "/v1/tts/ws" }), nil)
	do := func(key string) int {
		r := httptest.NewRequest("GET", "/v1/tts/ws?token="+key, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	codes := make(chan int, 8)
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
	for range 3 { // the admin key is not limited
		go func() { codes <- do("0123456789abcdef-adm") }()
		<-entered
	}
	close(release)
	for range 6 {
		if c := <-codes; c != 204 {
			t.Errorf("session: %d", c)
		}
	}
	if c := do("0123456789abcdef-one"); c != 204 {
		t.Errorf("after the others ended: %d", c)
	}
}

func TestPrincipals(t *testing.T) {
	k, _ := NewKeys([]string{"0123456789abcdef-one", "0123456789abcdef-two"}, "0123456789abcdef-adm")
	var got string
	h := k.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = PrincipalOf(r.Context()) }), nil)
	seen := map[string]string{}
	for _, key := range []string{"0123456789abcdef-one", "0123456789abcdef-two", "0123456789abcdef-adm"} {
		r := httptest.NewRequest("GET", "/v1/voices", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got == "" || strings.Contains(got, key) {
			t.Errorf("key %s: principal %q", key, got)
		}
		seen[key] = got
	}
	if seen["0123456789abcdef-one"] == seen["0123456789abcdef-two"] || seen["0123456789abcdef-adm"] != Admin {
		t.Errorf("principals %v", seen)
	}
	if !CanSee("k_1", Admin) || !CanSee("k_1", "k_1") || CanSee("k_1", "k_2") || CanSee("", "k_2") {
		t.Error("CanSee")
	}
	if PrincipalOf(httptest.NewRequest("GET", "/", nil).Context()) != Admin {
		t.Error("a request without keys is not Admin")
	}
}

func TestGuardLocal(t *testing.T) {
	h := GuardLocal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	for _, c := range []struct {
		method, host, origin, site string
		want                       int
	}{
		{"GET", "localhost:8080", "", "", 204},
		{"GET", "127.0.0.1:8080", "", "", 204},
		{"GET", "[::1]:8080", "", "", 204},
		{"GET", "evil.example:8080", "", "", 421}, // DNS rebinding
		{"GET", "evil.example", "", "", 421},
		{"POST", "localhost:8080", "", "", 204},                             // curl
		{"POST", "localhost:8080", "http://localhost:8080", "", 204},        // the server's own page
		{"POST", "localhost:8080", "http://evil.example", "", 403},          // a cross-site form
		{"POST", "localhost:8080", "null", "", 403},                         // a sandboxed page
		{"DELETE", "localhost:8080", "", "cross-site", 403},                 // fetch from elsewhere
		{"POST", "localhost:8080", "http://localhost:8081", "", 403},        // another local server
		{"GET", "localhost:8080", "http://evil.example", "cross-site", 204}, // reads are same-origin-policed by the browser
	} {
		r := httptest.NewRequest(c.method, "/v1/voices", nil)
		r.Host = c.host
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != c.want {
			t.Errorf("%s host %s origin %q: %d, want %d", c.method, c.host, c.origin, rec.Code, c.want)
		}
	}
}
