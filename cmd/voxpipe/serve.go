package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with --debug-listen
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/voxpipe/voxpipe/buffers"
	"github.com/voxpipe/voxpipe/rtc"
	"github.com/voxpipe/voxpipe/stream"
	"github.com/voxpipe/voxpipe/web"
)

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", "serve [flags]", stderr)
	listen := fs.String("listen", "localhost:8080", "HTTP address (HOST:PORT)")
	voice := fs.String("voice", "dsp", "default voice for new sessions")
	jitter := fs.Duration("jitter-target", 40*time.Millisecond, "initial jitter buffer target (adapts to measured jitter)")
	udpPort := fs.Int("udp-port", 0, "serve all WebRTC media on this one UDP port (0: a port per session)")
	publicIP := fs.String("public-ip", "", "comma-separated IPs to advertise in ICE candidates (server behind 1:1 NAT)")
	loopback := fs.Bool("loopback", true, "offer loopback ICE candidates (clients on the same host)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	debug := fs.String("debug-listen", "", "serve Go's pprof profiles on this address (e.g. localhost:6060)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		return err
	}
	voices := stream.NewRegistry()
	if _, err := voices.New(*voice); err != nil {
		return err
	}
	var ips []string
	if *publicIP != "" {
		ips = strings.Split(*publicIP, ",")
	}
	srv, err := rtc.NewServer(rtc.Config{
		Voices: voices, DefaultVoice: *voice, Jitter: buffers.JitterConfig{Target: *jitter},
		Loopback: *loopback, PublicIPs: ips, UDPPort: *udpPort, Logger: log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if *debug != "" {
		go func() { log.Warn("debug server ended", "err", http.ListenAndServe(*debug, http.DefaultServeMux)) }()
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/rtc", srv)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"status": "ok", "sessions": srv.Active()})
	})
	mux.HandleFunc("GET /v1/voices", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"voices": voices.Names(), "default": *voice})
	})
	mux.Handle("/", web.Handler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Fprintf(stdout, "voxpipe serving on http://%s (voice %q) — open it in a browser; Ctrl-C stops\n", ln.Addr(), *voice)
	select {
	case err := <-errc:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Close() // ends live sessions (hijacked sockets are not closed by Shutdown)
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
