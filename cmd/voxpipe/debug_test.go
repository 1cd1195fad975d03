package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/voxpipe/voxpipe/server/auth"
)

// TestDebugHandler: profiles are loopback-only unless an admin key guards them, and the
// command line (which can hold --api-key) is never served.
func TestDebugHandler(t *testing.T) {
	none, _ := auth.NewKeys(nil)
	if _, err := debugHandler("0.0.0.0:6060", none); err == nil {
		t.Error("a public debug address without keys was accepted")
	}
	get := func(h http.Handler, path, key string) int {
		r := httptest.NewRequest("GET", path, nil)
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	local, err := debugHandler("localhost:6060", none)
	if err != nil {
		t.Fatal(err)
	}
	if c := get(local, "/debug/pprof/cmdline", ""); c != http.StatusNotFound {
		t.Errorf("cmdline: %d", c)
	}
	if c := get(local, "/debug/pprof/heap", ""); c != http.StatusOK {
		t.Errorf("heap on loopback: %d", c)
	}
	keys, _ := auth.NewKeys([]string{"client-key-0123456789"}, "admin-key-0123456789")
	public, err := debugHandler("0.0.0.0:6060", keys)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"": 401, "client-key-0123456789": 403, "admin-key-0123456789": 200} {
		if c := get(public, "/debug/pprof/heap", key); c != want {
			t.Errorf("public heap with key %q: %d, want %d", key, c, want)
		}
	}
	if c := get(public, "/debug/pprof/cmdline", "admin-key-0123456789"); c != http.StatusNotFound {
		t.Errorf("cmdline for admin: %d", c)
	}
}
