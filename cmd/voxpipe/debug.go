package main

import (
	"fmt"
	"net/http"
	"net/http/pprof"

	"github.com/voxpipe/voxpipe/server/auth"
)

// debugHandler serves Go's profiles for --debug-listen. Profiles show everything in the
// process's memory, so the address must be loopback, or else every request needs an admin
// key. The command line (pprof's cmdline) is left out: it can hold --api-key.
func debugHandler(addr string, keys *auth.Keys) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // also serves the named profiles (heap, goroutine…)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/cmdline", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not served: the command line can hold secrets", http.StatusNotFound)
	})
	if auth.Loopback(addr) {
		return mux, nil
	}
	if !keys.Enabled() {
		return nil, fmt.Errorf("--debug-listen %s is reachable from other machines: use a loopback address, or set --admin-key", addr)
	}
	return keys.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth.PrincipalOf(r.Context()) != auth.Admin {
			auth.WriteError(w, http.StatusForbidden, "forbidden", "profiles need an admin key")
			return
		}
		mux.ServeHTTP(w, r)
	}), nil), nil
}
