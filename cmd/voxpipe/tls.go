package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/voxpipe/voxpipe/internal/atomicfile"
)

// tlsConfig is the HTTPS setup of serve: a certificate and key from files (--tls-cert,
// --tls-key), or a self-signed one (--tls-self-signed) kept in dir so that its fingerprint
// stays the same across restarts, and renewed when it no longer names every address the
// server is reached at or is about to expire. It returns nil when TLS is off, and the
// certificate's SHA-256 fingerprint for the operator to compare in a browser's warning.
//
// Only HTTP/1.1 is offered: the signaling and TTS WebSockets are upgrades of HTTP/1.1
// requests (browsers open them over HTTP/1.1 unless the server offers RFC 8441).
func tlsConfig(o serveOptions, dir string) (*tls.Config, string, error) {
	switch {
	case o.tlsCert == "" && o.tlsKey == "" && !o.tlsSelfSigned:
		return nil, "", nil
	case o.tlsSelfSigned && (o.tlsCert != "" || o.tlsKey != ""):
		return nil, "", errors.New("--tls-self-signed makes its own certificate: give it or --tls-cert/--tls-key, not both")
	case !o.tlsSelfSigned && (o.tlsCert == "") != (o.tlsKey == ""):
		return nil, "", errors.New("--tls-cert and --tls-key go together")
	}
	certFile, keyFile := o.tlsCert, o.tlsKey
	if o.tlsSelfSigned {
		certFile, keyFile = filepath.Join(dir, "self-signed.crt"), filepath.Join(dir, "self-signed.key")
		if err := ensureSelfSigned(certFile, keyFile, serverNames(o)); err != nil {
			return nil, "", fmt.Errorf("--tls-self-signed: %w", err)
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("TLS certificate: %w", err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	hexes := make([]string, len(sum))
	for i, b := range sum {
		hexes[i] = fmt.Sprintf("%02X", b)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		strings.Join(hexes, ":"), nil
}

// serverNames are the names and addresses a self-signed certificate must cover: the local
// ones, the listen host, --public-ip, and this machine's interface addresses (a LAN client
// reaches it by one of them).
func serverNames(o serveOptions) []string {
	names := []string{"localhost", "127.0.0.1", "::1"}
	if host, _, err := net.SplitHostPort(o.listen); err == nil && host != "" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			names = append(names, host)
		}
	}
	if o.publicIP != "" {
		names = append(names, strings.Split(o.publicIP, ",")...)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				names = append(names, n.IP.String())
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// ensureSelfSigned keeps a self-signed certificate for names at certFile/keyFile, making a
// new one when there is none, it misses a name, or it expires within 30 days.
func ensureSelfSigned(certFile, keyFile string, names []string) error {
	if c, err := tls.LoadX509KeyPair(certFile, keyFile); err == nil {
		if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && time.Until(leaf.NotAfter) > 30*24*time.Hour &&
			!slices.ContainsFunc(names, func(n string) bool { return leaf.VerifyHostname(n) != nil }) {
			return nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "voxpipe (self-signed)"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return err
	}
	// The key first, private; each file written whole then renamed, so a crash leaves the
	// old pair or the new one.
	if err := atomicfile.Write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600, ".tmp-*"); err != nil {
		return err
	}
	return atomicfile.Write(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644, ".tmp-*")
}
