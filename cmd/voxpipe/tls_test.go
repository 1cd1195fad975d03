package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// --tls-self-signed: the server speaks HTTPS with a certificate for its names, kept across
// restarts (same fingerprint), renewed when it misses a name; the signaling WebSocket works
// over it (wss, HTTP/1.1); a client that trusts the certificate sees nothing else wrong.
func TestServeTLSSelfSigned(t *testing.T) {
	dir := t.TempDir()
	o := serveOptions{tlsSelfSigned: true, listen: "127.0.0.1:0", voicesDir: filepath.Join(dir, "voices")}
	cfg, fp, err := tlsConfig(o, filepath.Join(dir, "tls"))
	if err != nil || cfg == nil || len(fp) != 32*3-1 {
		t.Fatalf("tlsConfig: %v, fingerprint %q", err, fp)
	}
	_, again, err := tlsConfig(o, filepath.Join(dir, "tls"))
	if err != nil || again != fp {
		t.Errorf("restart: fingerprint %q, was %q (%v)", again, fp, err)
	}
	o.publicIP = "203.0.113.7"
	_, renewed, err := tlsConfig(o, filepath.Join(dir, "tls"))
	if err != nil || renewed == fp {
		t.Errorf("a new --public-ip did not renew the certificate: %q (%v)", renewed, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "tls", "self-signed.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", st, err)
	}
	o.tls, _, err = tlsConfig(o, filepath.Join(dir, "tls"))
	if err != nil {
		t.Fatal(err)
	}

	s := startServe(t, o)
	pem, err := os.ReadFile(filepath.Join(dir, "tls", "self-signed.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	trust := &tls.Config{RootCAs: pool}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: trust}}
	resp, err := client.Get("https://" + s.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("GET /healthz over TLS: %d", resp.StatusCode)
	}
	// Also by name: the certificate covers localhost.
	port := s.addr[strings.LastIndex(s.addr, ":"):]
	if resp, err := client.Get("https://localhost" + port + "/"); err != nil {
		t.Errorf("https://localhost: %v", err)
	} else {
		resp.Body.Close()
	}
	d := websocket.Dialer{TLSClientConfig: trust, HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial("wss://"+s.addr+"/v1/rtc", nil)
	if err != nil {
		t.Fatalf("wss /v1/rtc: %v (%v)", err, resp)
	}
	ws.Close()
	// A client that does not trust it is refused by its own TLS check, not by the server.
	if _, err := (&http.Client{Timeout: 5 * time.Second}).Get("https://" + s.addr + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("an untrusting client: %v", err)
	}
}

// The TLS flags refuse combinations that cannot work, naming the flags.
func TestServeTLSFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", "a.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-self-signed", "--tls-key", "k.pem"}, "not both"},
		{[]string{"--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"}, "TLS certificate"},
	} {
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--voices", t.TempDir()}, tc.args...)
		if _, stderr, code := runCmd(t, args...); code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q", tc.args, code, stderr)
		}
	}
}
