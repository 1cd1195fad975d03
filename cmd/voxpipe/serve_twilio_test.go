package main

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

// TestServeTwilioSignature: serve's --twilio-auth-token and --twilio-public-url reach the
// telephony endpoint (an unsigned stream is refused with 403, one signed for the public URL
// passes the check), and bad settings stop serve at start.
func TestServeTwilioSignature(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	base := testApp(t, serveOptions{twilioAuthTokens: []string{token}, twilioPublicURL: "https://voice.example.org"})
	get := func(path, sig string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		if sig != "" {
			req.Header.Set("X-Twilio-Signature", sig)
		}
		return status(t, req, "")
	}
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte("wss://voice.example.org/v1/telephony/twilio"))
	sig := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, c := range []struct {
		path, sig string
		want      int
	}{
		{"/v1/telephony/twilio", "", 403},
		{"/v1/telephony/twilio", sig, 400}, // signed: on to the upgrade, which this plain GET fails
		{"/v1/telephony/raw", "", 400},     // not checked
	} {
		if got := get(c.path, c.sig); got != c.want {
			t.Errorf("GET %s (signature %q): %d, want %d", c.path, c.sig, got, c.want)
		}
	}

	dir := t.TempDir()
	if _, stderr, code := runCmd(t, "serve", "--voices", dir, "--twilio-public-url", "https://voice.example.org"); code == 0 || !strings.Contains(stderr, "needs --twilio-auth-token") {
		t.Errorf("public URL without a token: exit %d %q", code, stderr)
	}
	t.Setenv("VOXPIPE_TWILIO_AUTH_TOKEN", token) // the token from the environment
	if _, stderr, code := runCmd(t, "serve", "--voices", dir, "--twilio-public-url", "voice.example.org"); code == 0 || !strings.Contains(stderr, "--twilio-public-url \"voice.example.org\": want the base URL") {
		t.Errorf("a bad public URL: exit %d %q", code, stderr)
	}
}
