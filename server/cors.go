package server

import (
	"net/http"
	"strings"
)

// whipCORS lets browser WHIP and WHEP clients on other origins use the endpoints, as RFC 9725
// (§4.4 and §4.5) asks: a preflight OPTIONS is answered before any key is asked for (browsers
// send it without credentials) and says what a POST or DELETE may carry; every response
// exposes the headers a client must read (Location, the session's resource). Clients
// authenticate with a bearer token, never a cookie, so any origin may be allowed. A server
// without API keys still refuses cross-origin writes (auth.GuardLocal): it trusts only pages
// of its own.
func whipCORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/v1/whip") && !strings.HasPrefix(r.URL.Path, "/v1/whep") {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", "Location, Link, ETag, Accept-Post")
		if r.Method != http.MethodOptions {
			next.ServeHTTP(w, r)
			return
		}
		methods := "DELETE, OPTIONS" // a session's or a viewer's resource
		if r.URL.Path == "/v1/whip" || strings.HasPrefix(r.URL.Path, "/v1/whep/") && strings.Count(r.URL.Path, "/") == 3 {
			methods = "POST, OPTIONS" // the endpoints: /v1/whip, /v1/whep/{session}
			h.Set("Accept-Post", "application/sdp")
		}
		h.Set("Allow", methods)
		h.Set("Access-Control-Allow-Methods", methods)
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, If-Match")
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
	})
}
