package server

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// accessLog logs one line per request when it ends: method, path, status, bytes, duration,
// remote address and user agent. The query string is left out: tokens may travel in it.
// Long-lived requests (WebSockets, speech streams) are logged when they close, with the
// time they lasted.
func accessLog(next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			status := rec.status
			switch {
			case rec.hijacked:
				status = http.StatusSwitchingProtocols
			case status == 0:
				status = http.StatusOK // nothing written: net/http answers 200
			}
			log.Info("request", "method", r.Method, "path", r.URL.Path, "status", status, "bytes", rec.bytes,
				"duration", time.Since(start).Round(time.Microsecond), "remote", r.RemoteAddr, "user_agent", r.UserAgent())
		}()
		next.ServeHTTP(rec, r)
	})
}

// statusRecorder notes a response's status and size. It passes Flush and Hijack through
// (streams and WebSocket upgrades need them) and unwraps for http.ResponseController.
type statusRecorder struct {
	http.ResponseWriter
	status   int
	bytes    int64
	hijacked bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.hijacked = true
	}
	return c, rw, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
