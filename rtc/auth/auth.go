// Package auth guards the server's endpoints with API keys: `Authorization: Bearer KEY`, or a
// `token` query parameter for clients that cannot set headers (browser WebSockets, some WHIP
// senders). A server on a loopback address may run without keys; anywhere else it must
// have some (see Required).
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
)

// Keys is a set of accepted API keys. The zero value accepts everything (no auth).
type Keys struct {
	sums [][32]byte
}

// NewKeys parses keys (empty entries ignored). Keys shorter than 16 characters are refused:
// they are guessable.
func NewKeys(keys []string) (*Keys, error) {
	k := &Keys{}
	for _, s := range keys {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if len(s) < 16 {
			return nil, fmt.Errorf("auth: an API key must have at least 16 characters")
		}
		k.sums = append(k.sums, sha256.Sum256([]byte(s)))
	}
	return k, nil
}

// Enabled reports whether any key is configured.
func (k *Keys) Enabled() bool { return k != nil && len(k.sums) > 0 }

// valid compares in constant time (over hashes, so the key length leaks nothing either).
func (k *Keys) valid(key string) bool {
	sum := sha256.Sum256([]byte(key))
	ok := 0
	for _, s := range k.sums {
		ok |= subtle.ConstantTimeCompare(s[:], sum[:])
	}
	return ok == 1
}

// KeyOf extracts the key a request presents, or "".
func KeyOf(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if k, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(k)
		}
		return ""
	}
	return r.URL.Query().Get("token")
}

// Middleware refuses requests without a valid key with 401 (JSON error), except for the
// paths in open (the page's static files, /healthz). With no keys it passes everything.
func (k *Keys) Middleware(next http.Handler, open func(path string) bool) http.Handler {
	if !k.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if open != nil && open(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		key := KeyOf(r)
		if key == "" || !k.valid(key) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="voxpipe"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			msg := "missing API key: send Authorization: Bearer KEY (or ?token=KEY)"
			if key != "" {
				msg = "invalid API key"
			}
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "unauthorized", "message": msg}})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Loopback reports whether a listen address (HOST:PORT) only accepts local connections.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Required checks the rule that binding beyond loopback needs keys.
func Required(listen string, k *Keys) error {
	if Loopback(listen) || k.Enabled() {
		return nil
	}
	return fmt.Errorf("listening on %s (reachable from other machines) needs API keys: set VOXPIPE_API_KEYS or --api-key", listen)
}

// LimitSessions refuses a key's request with 429 while that key already has max requests in
// flight on the long-lived paths (signaling and TTS sockets, streamed speech): one client
// cannot take every stream of the server. No keys or max ≤ 0: no limit.
func (k *Keys) LimitSessions(next http.Handler, max int, long func(path string) bool) http.Handler {
	if !k.Enabled() || max <= 0 {
		return next
	}
	var mu sync.Mutex
	open := map[[32]byte]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := KeyOf(r)
		if key == "" || !long(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		id := sha256.Sum256([]byte(key))
		mu.Lock()
		if open[id] >= max {
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusTooManyRequests)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "too_many_sessions",
				"message": fmt.Sprintf("this API key already has %d open sessions", max)}})
			return
		}
		open[id]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			if open[id]--; open[id] == 0 {
				delete(open, id)
			}
			mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}
