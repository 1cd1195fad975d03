// Package auth guards the server's endpoints with API keys: `Authorization: Bearer KEY`, or a
// `token` query parameter for clients that cannot set headers (browser WebSockets, some WHIP
// senders). A server on a loopback address may run without keys; anywhere else it must
// have some (see Required).
//
// Every request that passes the middleware carries a principal (PrincipalOf): who made it.
// Sessions and voices belong to the principal that made them, and other principals cannot
// see them; an admin key, and every client of a server without keys, is Admin and sees all.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
)

// Admin is the principal of an admin key and of every request to a server without keys.
const Admin = "*"

// CanSee reports whether principal may see or use something owned by owner.
func CanSee(owner, principal string) bool { return principal == Admin || owner == principal }

type principalKey struct{}

// WithPrincipal returns ctx carrying principal p.
func WithPrincipal(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalOf is the principal a request context carries; Admin when none was set (a server
// without keys installs no middleware: its one user sees everything).
func PrincipalOf(ctx context.Context) string {
	if p, ok := ctx.Value(principalKey{}).(string); ok && p != "" {
		return p
	}
	return Admin
}

// Keys is a set of accepted API keys. The zero value accepts everything (no auth).
type Keys struct {
	sums  [][32]byte
	admin []bool // sums[i] is an admin key
}

// NewKeys parses client keys and admin keys (empty entries ignored). Keys shorter than 16
// characters are refused: they are guessable.
func NewKeys(keys []string, adminKeys ...string) (*Keys, error) {
	k := &Keys{}
	add := func(s string, admin bool) error {
		if s = strings.TrimSpace(s); s == "" {
			return nil
		}
		if len(s) < 16 {
			return fmt.Errorf("auth: an API key must have at least 16 characters")
		}
		k.sums = append(k.sums, sha256.Sum256([]byte(s)))
		k.admin = append(k.admin, admin)
		return nil
	}
	for _, s := range keys {
		if err := add(s, false); err != nil {
			return nil, err
		}
	}
	for _, s := range adminKeys {
		if err := add(s, true); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Enabled reports whether any key is configured.
func (k *Keys) Enabled() bool { return k != nil && len(k.sums) > 0 }

// principal finds key's principal in constant time (over hashes, so the key length leaks
// nothing either); "" when the key is not valid. A client key's principal is derived from
// its hash: stable across restarts, and it does not reveal the key.
func (k *Keys) principal(key string) string {
	sum := sha256.Sum256([]byte(key))
	found, admin := 0, 0
	for i, s := range k.sums {
		eq := subtle.ConstantTimeCompare(s[:], sum[:])
		found |= eq
		if k.admin[i] {
			admin |= eq
		}
	}
	switch {
	case found == 0:
		return ""
	case admin == 1:
		return Admin
	}
	return "k_" + hex.EncodeToString(sum[:8])
}

// Lookup is key's principal, ok false when key is not one of k's: for protocols whose key
// arrives after the request (a telephony stream's start message).
func (k *Keys) Lookup(key string) (principal string, ok bool) {
	p := k.principal(key)
	return p, p != ""
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

// WriteError writes the JSON error body the server uses everywhere outside the protocols.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// Middleware refuses requests without a valid key with 401 (JSON error), except for the
// paths in open (the page's static files, /healthz), and puts the key's principal in the
// request context. With no keys it passes everything (every request is Admin).
func (k *Keys) Middleware(next http.Handler, open func(path string) bool) http.Handler {
	if !k.Enabled() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := KeyOf(r)
		p := ""
		if key != "" {
			p = k.principal(key)
		}
		if p != "" {
			next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
			return
		}
		if open != nil && open(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="voxpipe"`)
		msg := "missing API key: send Authorization: Bearer KEY (or ?token=KEY)"
		if key != "" {
			msg = "invalid API key"
		}
		WriteError(w, http.StatusUnauthorized, "unauthorized", msg)
	})
}

// Loopback reports whether a listen address (HOST:PORT) only accepts local connections.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return loopbackHost(host)
}

func loopbackHost(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// Required checks the rule that binding beyond loopback needs keys.
func Required(listen string, k *Keys) error {
	if Loopback(listen) || k.Enabled() {
		return nil
	}
	return fmt.Errorf("listening on %s (reachable from other machines) needs API keys: set VOXPIPE_API_KEYS or --api-key", listen)
}

// SessionLimit bounds the sessions one principal holds at once, over every path that makes
// one (signaling and TTS sockets, streamed speech, WHIP sessions, WHEP viewers): one client
// cannot take every stream of the server. Admin is not limited. A nil *SessionLimit, or
// one with Max ≤ 0, limits nothing.
type SessionLimit struct {
	Max  int
	mu   sync.Mutex
	open map[string]int
}

// NewSessionLimit makes a limit of max sessions per principal (≤ 0: none).
func NewSessionLimit(max int) *SessionLimit { return &SessionLimit{Max: max, open: map[string]int{}} }

// Acquire takes one of principal's sessions; ok is false when it already holds Max. The
// release function must be called once when the session ends.
func (l *SessionLimit) Acquire(principal string) (release func(), ok bool) {
	if l == nil || l.Max <= 0 || principal == Admin {
		return func() {}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[principal] >= l.Max {
		return nil, false
	}
	l.open[principal]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			if l.open[principal]--; l.open[principal] <= 0 {
				delete(l.open, principal)
			}
			l.mu.Unlock()
		})
	}, true
}

// Refuse answers 429 too_many_sessions for a principal at its limit.
func (l *SessionLimit) Refuse(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "5")
	WriteError(w, http.StatusTooManyRequests, "too_many_sessions",
		fmt.Sprintf("this API key already has %d open sessions", l.Max))
}

// Middleware holds one session for each request on the long-lived paths (signaling and TTS
// sockets, streamed speech) while it runs, refusing with 429 at the limit.
func (l *SessionLimit) Middleware(next http.Handler, long func(path string) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !long(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		release, ok := l.Acquire(PrincipalOf(r.Context()))
		if !ok {
			l.Refuse(w)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// GuardLocal protects a server without keys, which trusts whoever reaches it, from web pages
// that a local browser opens: a Host that is not a loopback name (DNS rebinding: evil.example
// resolving to 127.0.0.1) gets 421, and a state-changing request from another origin (a
// cross-site form post, CSRF) gets 403. WebSocket upgrades check their origin themselves.
func GuardLocal(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if !loopbackHost(host) {
			WriteError(w, http.StatusMisdirectedRequest, "bad_host",
				"this server has no API keys and answers only to localhost names; use http://localhost or start it with --api-key")
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if !sameOrigin(r) {
				WriteError(w, http.StatusForbidden, "cross_origin",
					"cross-origin requests are refused by a server without API keys")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sameOrigin reports whether a request's Origin (and the browser's Sec-Fetch-Site) show it
// comes from a page of this server, or from no page at all (curl, SDKs send no Origin).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, ok := strings.CutPrefix(origin, "http://")
	if !ok {
		u, ok = strings.CutPrefix(origin, "https://")
	}
	return ok && strings.EqualFold(u, r.Host)
}
