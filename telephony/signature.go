package telephony

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Twilio signs every request it makes, the WebSocket upgrade of a <Stream> included, with
// the X-Twilio-Signature header: base64(HMAC-SHA1(auth token, the URL as Twilio requested
// it, then for a POST each form parameter, sorted by name, as name+value)). With
// Config.TwilioAuthTokens set, the Twilio endpoint checks it before the upgrade
// (docs/telephony.md#twilios-signature).

// SignatureHeader is the header Twilio signs its requests with.
const SignatureHeader = "X-Twilio-Signature"

// CodeBadSignature is the error code of a Twilio request whose signature is missing or
// does not verify (HTTP 403, before the upgrade).
const CodeBadSignature = "bad_signature"

// signatureLen is the length of a well-formed signature: 20 bytes of HMAC-SHA1 in base64.
const signatureLen = 28

// maxSignedURL bounds the path and query of a request whose signature is checked (a
// <Stream> URL is short; a longer one is refused without hashing it).
const maxSignedURL = 4 << 10

// TwilioSignature is Twilio's signature of a request to rawURL (the full URL as Twilio
// requested it: scheme, host, port if it named one, path, query) with the POST form
// parameters params (nil for a GET, such as a stream's WebSocket upgrade): the base64 of
// the HMAC-SHA1, keyed with the auth token, of the URL followed by every parameter, sorted
// by name, as name+value (the values of a repeated name in sorted order).
func TwilioSignature(authToken, rawURL string, params url.Values) string {
	return base64.StdEncoding.EncodeToString(twilioMAC(hmac.New(sha1.New, []byte(authToken)), rawURL, params))
}

func twilioMAC(mac hash.Hash, rawURL string, params url.Values) []byte {
	mac.Reset()
	io.WriteString(mac, rawURL)
	for _, name := range slices.Sorted(maps.Keys(params)) {
		values := slices.Clone(params[name])
		slices.Sort(values)
		for _, v := range values {
			io.WriteString(mac, name)
			io.WriteString(mac, v)
		}
	}
	return mac.Sum(nil)
}

// CheckTwilioPublicURL reports whether raw can be Config.TwilioPublicURL: an absolute
// https:// or wss:// URL (http:// or ws:// for tests) with a host, optionally a port and a
// path prefix, and nothing else.
func CheckTwilioPublicURL(raw string) error {
	_, err := parsePublicURL(raw)
	return err
}

// parsePublicURL parses a public base URL into its WebSocket form (https → wss, http → ws)
// without a trailing slash.
func parsePublicURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(u.Scheme) {
	case "https", "wss":
		u.Scheme = "wss"
	case "http", "ws":
		u.Scheme = "ws"
	default:
		return nil, fmt.Errorf("%q: want the base URL Twilio connects to, such as https://voice.example.org", raw)
	}
	if u.Host == "" || u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("%q: want scheme://HOST[:PORT][/PREFIX], without user, query or fragment", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	return u, nil
}

// twilioVerifier checks the signature of requests to the Twilio endpoint.
type twilioVerifier struct {
	tokens [][]byte
	public *url.URL // the public base URL (WebSocket scheme); nil: the request's own
	bad    error    // the public URL did not parse: every request is refused
}

// newTwilioVerifier makes a verifier for the non-empty tokens (nil when there are none:
// signatures are not checked).
func newTwilioVerifier(tokens []string, public string) *twilioVerifier {
	v := &twilioVerifier{}
	for _, t := range tokens {
		if t = strings.TrimSpace(t); t != "" {
			v.tokens = append(v.tokens, []byte(t))
		}
	}
	if len(v.tokens) == 0 {
		return nil
	}
	if public != "" {
		v.public, v.bad = parsePublicURL(public)
	}
	return v
}

// verify checks r's signature. It returns the URL the signature had to be of (the first
// form tried, for the error message and the log) and, when it fails, why.
func (v *twilioVerifier) verify(r *http.Request) (signed string, problem error) {
	sigs := r.Header.Values(SignatureHeader)
	switch {
	case len(sigs) == 0:
		return "", errors.New("missing " + SignatureHeader + " (the request does not come from Twilio)")
	case len(sigs) > 1:
		return "", errors.New("more than one " + SignatureHeader)
	case len(sigs[0]) != signatureLen:
		return "", errors.New("malformed " + SignatureHeader) // refused without hashing anything
	}
	path, query := r.URL.EscapedPath(), r.URL.RawQuery
	if len(path)+len(query) > maxSignedURL {
		return "", errors.New("URL too long to check its signature")
	}
	scheme, host := "ws", r.Host
	if r.TLS != nil {
		scheme = "wss"
	}
	if v.public != nil {
		scheme, host = v.public.Scheme, v.public.Host
		path = v.public.EscapedPath() + path
	}
	cands := candidateURLs(scheme, host, path, query)
	want := []byte(sigs[0])
	got := make([]byte, 0, signatureLen)
	for _, tok := range v.tokens {
		mac := hmac.New(sha1.New, tok)
		for _, c := range cands {
			got = base64.StdEncoding.AppendEncode(got[:0], twilioMAC(mac, c.url, c.params))
			if hmac.Equal(got, want) {
				return cands[0].url, nil
			}
		}
	}
	return cands[0].url, errors.New(SignatureHeader + " does not match " + trunc(cands[0].url, 200) +
		": check the auth token, and behind a proxy the public URL (--twilio-public-url)")
}

// signedForm is one form of the URL a request may have been signed for.
type signedForm struct {
	url    string
	params url.Values
}

// candidateURLs are the forms of a stream's URL whose signature is accepted, the likeliest
// first: the WebSocket scheme Twilio connects with (and its https/http twin, should the
// signing use that); the host with and without its port (the scheme's default port when it
// names none: Twilio signs some requests either way); and, when there is a query, the URL
// with it, or without it and its parameters signed as POST parameters are (as Twilio's own
// validators treat a WebSocket upgrade's query).
func candidateURLs(scheme, host, path, query string) []signedForm {
	hostname, port := splitHost(host)
	defPort, twin := "443", "https"
	if scheme == "ws" {
		defPort, twin = "80", "http"
	}
	if port == "" {
		port = defPort
	}
	hosts := []string{host}
	if bare, withPort := bracket(hostname), net.JoinHostPort(hostname, port); host == bare {
		hosts = append(hosts, withPort)
	} else {
		hosts = append(hosts, bare)
	}
	var params url.Values
	if query != "" {
		params, _ = url.ParseQuery(query)
	}
	var out []signedForm
	for _, s := range []string{scheme, twin} {
		for _, h := range hosts {
			base := s + "://" + h + path
			if query == "" {
				out = append(out, signedForm{url: base})
				continue
			}
			out = append(out, signedForm{url: base + "?" + query}, signedForm{url: base, params: params})
		}
	}
	return out
}

// splitHost splits HOST[:PORT] (HOST may be a bracketed IPv6 address).
func splitHost(host string) (hostname, port string) {
	if h, p, err := net.SplitHostPort(host); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ""
}

// bracket writes a hostname as it appears in a URL without a port.
func bracket(hostname string) string {
	if strings.Contains(hostname, ":") {
		return "[" + hostname + "]"
	}
	return hostname
}
