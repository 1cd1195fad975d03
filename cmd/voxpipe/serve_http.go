package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/voxpipe/voxpipe/internal/netlimit"
)

// Defaults of the connection limits and timeouts (serve's flags; serveOptions fields left
// zero take them).
const (
	defaultShutdownGrace = 5 * time.Second
	defaultIdleTimeout   = 30 * time.Second
	defaultBodyTimeout   = 30 * time.Second
	defaultConnsPerIP    = 256
	// headerTimeout bounds reading a request's line and headers (slow-loris headers).
	headerTimeout = 10 * time.Second
	// responseTimeout bounds writing an ordinary response (from the end of its headers):
	// streams move their deadline on per chunk, WebSockets drop it when they take over.
	responseTimeout = time.Minute
	// forceWait is how long serve waits for the sessions after closing every connection at
	// the end of the grace period, before it returns without them.
	forceWait = time.Second
)

// serve runs the HTTP server on ln until ctx ends, then turns /readyz to 503, serves on for
// o.drainDelay (0: not at all) and shuts down in about o.shutdownGrace: it stops accepting,
// ends every stream at once (WebSockets get close code 1001, speech responses still
// streaming are cut so clients see the truncation), lets other requests finish within the
// grace period, then closes every connection left, hijacked ones included, and returns at
// most forceWait later. It closes a.
func serve(ctx context.Context, o serveOptions, ln net.Listener, a *app, log *slog.Logger) error {
	grace := o.shutdownGrace
	if grace <= 0 {
		grace = defaultShutdownGrace
	}
	idle, body := o.idleTimeout, o.bodyTimeout
	if idle <= 0 {
		idle = defaultIdleTimeout
	}
	if body <= 0 {
		body = defaultBodyTimeout
	}
	lim := netlimit.New(ln, o.connsPerIP)
	lim.OnRefuse = func(addr net.Addr) {
		log.Debug("connection refused: too many from one address", "remote", addr, "limit", o.connsPerIP)
	}
	hs := &http.Server{
		Handler:           bodyDeadline(a.handler, body),
		ReadHeaderTimeout: headerTimeout,
		// Not ReadTimeout: its deadline stays on the connection while the handler runs, and
		// net/http's background read then cancels the request's context, cutting long speech
		// streams. bodyDeadline bounds only the body.
		WriteTimeout: responseTimeout,
		IdleTimeout:  idle,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn), // handler panics, accept errors
	}
	errc := make(chan error, 1)
	if o.tls != nil {
		hs.TLSConfig = o.tls
		go func() { errc <- hs.ServeTLS(lim, "", "") }()
	} else {
		go func() { errc <- hs.Serve(lim) }()
	}
	select {
	case err := <-errc:
		a.close()
		return err
	case <-ctx.Done():
	}
	// Readiness turns first: a load balancer polling /readyz stops sending new work while,
	// for --drain-delay, everything is still served as usual.
	a.draining.Store(true)
	if o.drainDelay > 0 {
		log.Info("draining: /readyz answers 503 until the shutdown", "delay", o.drainDelay)
		select {
		case err := <-errc:
			a.close()
			return err
		case <-time.After(o.drainDelay):
		}
	}
	log.Info("shutting down", "grace", grace)
	deadline := time.Now().Add(grace)
	lim.Close() // stop accepting before the streams are told to end
	appDone := make(chan struct{})
	go func() {
		defer close(appDone)
		a.close() // ends live sessions and TTS streams at once, then waits for them
	}()
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("grace period over: closing the remaining connections", "err", err)
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		log.Warn("serve ended", "err", err)
	}
	select {
	case <-appDone:
		return nil
	case <-time.After(time.Until(deadline)):
	}
	// Whatever is still open (sessions' sockets, which http.Server does not track once
	// hijacked; requests that hs.Close is just ending) is closed now.
	lim.CloseAll()
	select {
	case <-appDone:
	case <-time.After(forceWait):
		log.Error("sessions did not end after their connections closed; exiting without them")
	}
	return nil
}

// bodyDeadline bounds the time a client has to send a request's body (a client that
// trickles it holds a connection and a handler), then clears the read deadline once the body
// is read: net/http's background read, which notices a client that goes away during a long
// response, must not time out with it.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(d)) == nil {
				b := &deadlineBody{ReadCloser: r.Body}
				b.clear = func() { rc.SetReadDeadline(time.Time{}) }
				r.Body = b
				defer b.done() // the controller may not be used after the handler returns
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline when its body has been read to the end.
type deadlineBody struct {
	io.ReadCloser
	mu      sync.Mutex
	clear   func()
	cleared bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

// done stops later clears: after the handler, net/http reads what is left of the body itself
// (still under the deadline) and then sets the deadline for the next request.
func (b *deadlineBody) done() { b.finish(false) }

func (b *deadlineBody) finish(clear bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cleared && clear {
		b.clear()
	}
	b.cleared = true
}
