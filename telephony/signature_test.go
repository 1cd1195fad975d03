package telephony_test

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/voxpipe/voxpipe/server/auth"
	"github.com/voxpipe/voxpipe/telephony"
)

// sign is Twilio's signature of a GET to u, computed here from the documented algorithm
// (base64 of the HMAC-SHA1 of the URL, keyed with the auth token), not with the package's.
func sign(token, u string) string {
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(u))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// TestTwilioSignatureVectors checks the signature against Twilio's published example and
// URL-only vectors made with openssl:
//
//	printf '%s' URL | openssl dgst -sha1 -hmac 12345 -binary | base64
func TestTwilioSignatureVectors(t *testing.T) {
	// Twilio's example (docs: webhooks security): a POST with form parameters.
	const docURL = "https://mycompany.com/myapp.php?foo=1&bar=2"
	params := url.Values{"CallSid": {"CA1234567890ABCDE"}, "Caller": {"+12349013030"}, "Digits": {"1234"},
		"From": {"+12349013030"}, "To": {"+18005551212"}}
	const docSig = "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
	if got := telephony.TwilioSignature("12345", docURL, params); got != docSig {
		t.Errorf("Twilio's example: %s, want %s", got, docSig)
	}
	// The same by hand: the URL, then name+value sorted by name.
	if got := sign("12345", docURL+"CallSidCA1234567890ABCDECaller+12349013030Digits1234From+12349013030To+18005551212"); got != docSig {
		t.Errorf("Twilio's example by hand: %s, want %s", got, docSig)
	}
	for _, v := range []struct{ url, sig string }{
		{docURL, "zYQTYrRWXE7LtzbG4PfP7/bkkGo="},
		{"wss://voice.example.org/v1/telephony/twilio", "OiXMg4rUfgJ3lU8G0GRSMJmqZE8="},
		{"wss://voice.example.org:443/v1/telephony/twilio", "1yORdJbxDFB4SgTu6a2NK2b4Avs="},
	} {
		if got := telephony.TwilioSignature("12345", v.url, nil); got != v.sig {
			t.Errorf("%s: %s, want %s (openssl)", v.url, got, v.sig)
		}
		if got := sign("12345", v.url); got != v.sig {
			t.Errorf("%s by hand: %s, want %s (openssl)", v.url, got, v.sig)
		}
	}
	// A repeated name: its values in sorted order, each as name+value.
	if got, want := telephony.TwilioSignature("k", "https://x/", url.Values{"b": {"2", "1"}, "a": {"z"}}), sign("k", "https://x/azb1b2"); got != want {
		t.Errorf("repeated parameter: %s, want %s", got, want)
	}
}

func TestCheckTwilioPublicURL(t *testing.T) {
	for _, ok := range []string{"https://voice.example.org", "wss://voice.example.org:8443/", "https://example.org/voxpipe", "http://127.0.0.1:8080", "https://[::1]:443"} {
		if err := telephony.CheckTwilioPublicURL(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"voice.example.org", "ftp://voice.example.org", "https://", "https://voice.example.org/?x=1", "https://u:p@voice.example.org", "https://voice.example.org/#f", "https://voice.example.org/%zz", "/v1/telephony/twilio"} {
		if err := telephony.CheckTwilioPublicURL(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// refusal dials url with header h and expects status with the JSON error code, and no
// upgrade.
func refusal(t *testing.T, url string, h http.Header, status int, code string) string {
	t.Helper()
	conn, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s: upgraded, want HTTP %d %s", url, status, code)
	}
	if resp == nil {
		t.Fatalf("dial %s: %v, want HTTP %d", url, err, status)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct{ Code, Message string }
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status || resp.Header.Get("Upgrade") != "" {
		t.Fatalf("dial %s: HTTP %d (Upgrade %q) %s, want %d", url, resp.StatusCode, resp.Header.Get("Upgrade"), raw, status)
	}
	if err := json.Unmarshal(raw, &body); err != nil || body.Error.Code != code {
		t.Fatalf("dial %s: body %s, want error code %s", url, raw, code)
	}
	return body.Error.Message
}

// callProceeds runs a short vc call on c: start, some media, media back, stop.
func callProceeds(t *testing.T, c *client, lines [][]byte) {
	t.Helper()
	for _, l := range lines[1:8] {
		c.send(l)
	}
	if m, ok := c.next(nil, 5*time.Second); !ok || m.Event != "media" {
		t.Fatalf("a signed call: %s (closed %v)", m.raw, c.closed)
	}
	c.send(lines[len(lines)-1])
	c.expectClose(websocket.CloseNormalClosure, "stream stopped")
}

func sigHeader(sig string) http.Header { return http.Header{telephony.SignatureHeader: {sig}} }

// TestTwilioSignatureCheck: with an auth token, a Twilio stream connects only with a valid
// X-Twilio-Signature of its URL (with or without the port, either of two tokens); anything
// else is refused with 403 before the upgrade, cheaply however large; the raw endpoint
// does not check.
func TestTwilioSignatureCheck(t *testing.T) {
	const token, next = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	srv, base := startServer(t, telephony.Config{TwilioAuthTokens: []string{token, " " + next + " ", ""}})
	u := base + "/v1/telephony/twilio"
	lines := loadFixture(t)
	noPort := strings.Replace(u, ":"+strings.Split(strings.TrimPrefix(base, "ws://"), ":")[1], "", 1)
	if noPort == u || !strings.HasPrefix(noPort, "ws://127.0.0.1/") {
		t.Fatalf("no port: %s", noPort)
	}

	t.Run("signed", func(t *testing.T) { callProceeds(t, dial(t, u, sigHeader(sign(token, u))), lines) })
	t.Run("signed without the port", func(t *testing.T) { callProceeds(t, dial(t, u, sigHeader(sign(token, noPort))), lines) })
	t.Run("the other token", func(t *testing.T) { callProceeds(t, dial(t, u, sigHeader(sign(next, u))), lines) })
	t.Run("signed with the query", func(t *testing.T) {
		q := u + "?voice=dsp&pitch_semitones=4"
		callProceeds(t, dial(t, q, sigHeader(sign(token, q))), lines)
	})
	t.Run("query signed as parameters", func(t *testing.T) {
		q := u + "?voice=dsp&pitch_semitones=4"
		callProceeds(t, dial(t, q, sigHeader(sign(token, u+"pitch_semitones4voicedsp"))), lines)
	})
	// The signed calls end on the server a moment after their clients hang up: wait, so
	// that a call still open below is one a refusal opened.
	waitIdle(t, srv)

	for _, c := range []struct {
		name, url string
		h         http.Header
		msg       string
	}{
		{"missing", u, nil, "missing X-Twilio-Signature"},
		{"empty", u, sigHeader(""), "malformed"},
		{"another token", u, sigHeader(sign("not-the-token", u)), "does not match " + u},
		{"another path", u, sigHeader(sign(token, strings.Replace(u, "twilio", "raw", 1))), "does not match"},
		{"another port", u, sigHeader(sign(token, strings.Replace(noPort, "127.0.0.1", "127.0.0.1:1", 1))), "does not match"},
		{"the query not signed", u + "?voice=dsp", sigHeader(sign(token, u)), "does not match"},
		{"wss for a plain server", u, sigHeader(sign(token, strings.Replace(u, "ws://", "wss://", 1))), "does not match"},
		{"the API key's place", u + "?token=" + sign(token, u), nil, "missing"},
		{"two headers", u, http.Header{telephony.SignatureHeader: {sign(token, u), sign(token, u)}}, "more than one"},
		{"not base64", u, sigHeader(strings.Repeat("!", 28)), "does not match"},
		{"huge", u, sigHeader(strings.Repeat("A", 256<<10)), "malformed"},
		{"huge URL", u + "?x=" + strings.Repeat("a", 8<<10), sigHeader(sign(token, u)), "URL too long"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if msg := refusal(t, c.url, c.h, http.StatusForbidden, telephony.CodeBadSignature); !strings.Contains(msg, c.msg) {
				t.Errorf("message %q, want %q", msg, c.msg)
			}
			if srv.Active() != 0 {
				t.Errorf("%d calls open after a refusal", srv.Active())
			}
		})
	}

	t.Run("raw ignores it", func(t *testing.T) {
		c := dial(t, base+"/v1/telephony/raw?encoding=mulaw", nil)
		c.conn.Close()
	})
	waitIdle(t, srv)
}

// TestTwilioSignatureHugeHeaderIsCheap: a signature header far larger than a server would
// read is refused on its length alone, without hashing the URL for each token.
func TestTwilioSignatureHugeHeaderIsCheap(t *testing.T) {
	tokens := make([]string, 16)
	for i := range tokens {
		tokens[i] = strings.Repeat(string(rune('a'+i)), 32)
	}
	srv := telephony.NewServer(telephony.Config{TwilioAuthTokens: tokens})
	defer srv.Close()
	req := httptest.NewRequest("GET", "http://voice.example.org/v1/telephony/twilio?x="+strings.Repeat("a", 3<<10), nil)
	req.Header.Set(telephony.SignatureHeader, strings.Repeat("A", 16<<20))
	start := time.Now()
	for range 100 {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, req)
		if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "malformed") {
			t.Fatalf("HTTP %d %s", w.Code, w.Body)
		}
	}
	// Hashing 16 MiB even once a request would take about a second for the 100.
	if d := time.Since(start); d > time.Second {
		t.Errorf("100 refusals took %v", d)
	}
}

// TestTwilioSignatureBehindProxy: with a public URL, the signature is of the URL Twilio
// connected to (wss://voice.example.org/…), not of what reaches the server behind its
// proxy (ws://127.0.0.1:PORT/…); with or without the default port, with a path prefix the
// proxy strips.
func TestTwilioSignatureBehindProxy(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	lines := loadFixture(t)
	srv, base := startServer(t, telephony.Config{TwilioAuthTokens: []string{token}, TwilioPublicURL: "https://voice.example.org/"})
	u := base + "/v1/telephony/twilio"
	const public = "wss://voice.example.org/v1/telephony/twilio"
	for _, signed := range []string{public, "wss://voice.example.org:443/v1/telephony/twilio", "https://voice.example.org/v1/telephony/twilio"} {
		t.Run(signed, func(t *testing.T) { callProceeds(t, dial(t, u, sigHeader(sign(token, signed))), lines) })
	}
	for _, signed := range []string{u, "wss://voice.example.org:8443/v1/telephony/twilio", "wss://evil.example.org/v1/telephony/twilio", "ws://voice.example.org/v1/telephony/twilio"} {
		t.Run(signed, func(t *testing.T) {
			if msg := refusal(t, u, sigHeader(sign(token, signed)), http.StatusForbidden, telephony.CodeBadSignature); !strings.Contains(msg, "does not match "+public) {
				t.Errorf("message %q", msg)
			}
		})
	}
	waitIdle(t, srv)

	// A public URL with a port and a prefix.
	srv, base = startServer(t, telephony.Config{TwilioAuthTokens: []string{token}, TwilioPublicURL: "wss://voice.example.org:8443/voxpipe"})
	u = base + "/v1/telephony/twilio"
	callProceeds(t, dial(t, u, sigHeader(sign(token, "wss://voice.example.org:8443/voxpipe/v1/telephony/twilio"))), lines)
	callProceeds(t, dial(t, u, sigHeader(sign(token, "wss://voice.example.org/voxpipe/v1/telephony/twilio"))), lines)
	refusal(t, u, sigHeader(sign(token, "wss://voice.example.org:8443/v1/telephony/twilio")), http.StatusForbidden, telephony.CodeBadSignature)
	waitIdle(t, srv)

	// An invalid public URL refuses every Twilio call (serve checks it at start).
	srv, base = startServer(t, telephony.Config{TwilioAuthTokens: []string{token}, TwilioPublicURL: "ftp://voice.example.org"})
	refusal(t, base+"/v1/telephony/twilio", sigHeader(sign(token, "wss://voice.example.org/v1/telephony/twilio")), http.StatusInternalServerError, telephony.CodeInternal)
	waitIdle(t, srv)
}

// TestTwilioSignatureAndKey: both checks hold: the signature admits the request (it comes
// from the Twilio account), the API key names the call's owner.
func TestTwilioSignatureAndKey(t *testing.T) {
	const token, key = "0123456789abcdef0123456789abcdef", "telephony-test-key-0123456789"
	keys, err := auth.NewKeys([]string{key})
	if err != nil {
		t.Fatal(err)
	}
	srv, base := startServer(t, telephony.Config{Keys: keys, TwilioAuthTokens: []string{token}})
	u := base + "/v1/telephony/twilio"
	lines := loadFixture(t)
	// A valid key does not replace the signature.
	refusal(t, u+"?token="+key, nil, http.StatusForbidden, telephony.CodeBadSignature)
	refusal(t, u, http.Header{"Authorization": {"Bearer " + key}, telephony.SignatureHeader: {sign("wrong", u)}}, http.StatusForbidden, telephony.CodeBadSignature)
	// A signed call without the key is refused by its start message, as without a token.
	c := dial(t, u, sigHeader(sign(token, u)))
	c.send(lines[1])
	c.expectClose(websocket.ClosePolicyViolation, "unauthorized: missing API key")
	// Signed, with the key in the start message: the call runs.
	c = dial(t, u, sigHeader(sign(token, u)))
	lines[1] = []byte(strings.Replace(string(lines[1]), `"customParameters":{}`, `"customParameters":{"token":"`+key+`"}`, 1))
	callProceeds(t, c, lines)
	// The raw endpoint still needs only the key.
	refusal(t, base+"/v1/telephony/raw", nil, http.StatusUnauthorized, telephony.CodeUnauthorized)
	dial(t, base+"/v1/telephony/raw?token="+key, nil).conn.Close()
	waitIdle(t, srv)
}
