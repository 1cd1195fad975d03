// Package web holds the browser voice-changer page, embedded into the server binary.
package web

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// contentTypes pins the types of the page's assets so they do not depend on the host's
// mime database (JS modules must be served as JavaScript or the browser refuses them).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".ico":  "image/x-icon",
	".png":  "image/png",
	".json": "application/json",
}

// Handler serves the embedded static files: index.html at "/", the assets by name.
// HTML is served with "no-cache"; other assets may be cached briefly but are revalidated.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed directive guarantees the directory exists
	}
	files := http.FileServer(http.FS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := r.URL.Path
		if strings.HasSuffix(name, "/") {
			name += "index.html"
		}
		ext := strings.ToLower(path.Ext(name))
		ct, ok := contentTypes[ext]
		if !ok {
			ct = mime.TypeByExtension(ext)
		}
		if ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		if ext == ".html" {
			w.Header().Set("Cache-Control", "no-cache")
		} else {
			w.Header().Set("Cache-Control", "public, max-age=300, must-revalidate")
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}
