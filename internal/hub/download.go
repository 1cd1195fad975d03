package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Client downloads catalog files from a hub.
type Client struct {
	Hub            string        // base URL (DefaultHub when empty)
	Token          string        // sent as Authorization: Bearer to the hub's host only (not to the CDN it redirects to)
	IdleTimeout    time.Duration // a connection that sends nothing this long is given up (default 60 s)
	ConnectTimeout time.Duration // TCP connect and TLS handshake (default 30 s)
	UserAgent      string
	// Progress, when set, is called as bytes arrive (often: throttle the drawing).
	Progress func(Progress)
	// Logf, when set, gets notes: resuming, starting over, what was checked.
	Logf func(format string, args ...any)
}

// Progress is the state of one download.
type Progress struct {
	Done  int64 // bytes in the part file
	Total int64 // the file's size; -1 when the server does not say
	Start int64 // bytes that were already there when this transfer began (resumed)
}

// Result describes a file in the cache after Pull.
type Result struct {
	Path    string
	Bytes   int64
	SHA256  string // hex; "" when the hub offered no checksum (the size was checked)
	Checked bool   // SHA256 was compared with the hub's
	Resumed int64  // bytes kept from an earlier, interrupted run
	Already bool   // the file was in the cache already; nothing was fetched
}

// InterruptedError is a download that stopped on a network error, a stalled connection or
// a cancel: the part file keeps what arrived, and the same pull again resumes from it.
type InterruptedError struct {
	URL  string
	Part string
	Have int64 // bytes in Part
	Err  error
}

func (e *InterruptedError) Error() string {
	if e.Have == 0 {
		return fmt.Sprintf("fetching %s: %v", e.URL, e.Err)
	}
	return fmt.Sprintf("download of %s interrupted at %s (kept in %s): %v", e.URL, MB(e.Have), e.Part, e.Err)
}

func (e *InterruptedError) Unwrap() error { return e.Err }

// HTTPError is a refusal by the server, with a message that says what to do.
type HTTPError struct {
	URL    string
	Status int
	msg    string
}

func (e *HTTPError) Error() string { return e.msg }

// MB formats a byte count in megabytes (10^6, as the hub shows sizes).
func MB(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

const maxRedirects = 10

// Pull fetches m's file into dir (created if missing) unless it is there already: into
// File.part, resuming a part left by an interrupted run, checking the size and — where the
// hub offers one — the sha256, then renaming it into place. A file that fails a check is
// removed, never left under its final name.
func (c *Client) Pull(ctx context.Context, m Model, dir string) (Result, error) {
	if !m.Published() {
		return Result{}, fmt.Errorf("%s is not published as a GGUF file: build it with %s", m.Name, m.ImportCommand(dir))
	}
	final := m.CachePath(dir)
	if st, err := os.Stat(final); err == nil && st.Mode().IsRegular() {
		return Result{Path: final, Bytes: st.Size(), Already: true}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	tr := c.transport()
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for attempt := 0; ; attempt++ {
		res, again, err := c.fetch(ctx, hc, m, final)
		if err != nil || !again {
			return res, err
		}
		if attempt >= 1 {
			return Result{}, fmt.Errorf("%s: the download did not settle after starting over; try again later", m.URL(c.hub()))
		}
	}
}

func (c *Client) hub() string {
	if c.Hub == "" {
		return DefaultHub
	}
	return c.Hub
}

func (c *Client) idle() time.Duration {
	if c.IdleTimeout <= 0 {
		return 60 * time.Second
	}
	return c.IdleTimeout
}

func (c *Client) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

func (c *Client) transport() *http.Transport {
	connect := c.ConnectTimeout
	if connect <= 0 {
		connect = 30 * time.Second
	}
	t := http.DefaultTransport.(*http.Transport).Clone() // keeps the proxy settings from the environment
	t.DialContext = (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = connect
	t.ResponseHeaderTimeout = c.idle()
	return t
}

// linkInfo is what the hub says about the file, from any response on the redirect chain:
// Hugging Face puts the LFS object's size and sha256 on the resolve response (the redirect),
// not on the CDN's.
type linkInfo struct {
	size   int64  // X-Linked-Size; -1 when absent
	sha256 string // X-Linked-Etag, or an ETag that is a sha256
	etag   string // a 64-hex ETag seen (lower priority)
}

func (l *linkInfo) collect(h http.Header) {
	if v := h.Get("X-Linked-Size"); v != "" && l.size < 0 {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
			l.size = n
		}
	}
	if s := sha256Tag(h.Get("X-Linked-Etag")); s != "" && l.sha256 == "" {
		l.sha256 = s
	}
	if s := sha256Tag(h.Get("ETag")); s != "" && l.etag == "" {
		l.etag = s
	}
}

func (l *linkInfo) sum() string {
	if l.sha256 != "" {
		return l.sha256
	}
	return l.etag
}

// sha256Tag returns the hex digest in an entity tag like "abc…" or W/"abc…" when it is
// 64 hex digits (a sha256), else "".
func sha256Tag(v string) string {
	v = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), "W/"))
	v = strings.ToLower(strings.Trim(v, `"`))
	if len(v) != 64 {
		return ""
	}
	if _, err := hex.DecodeString(v); err != nil {
		return ""
	}
	return v
}

// get requests rawURL from offset on, following redirects itself so that the Authorization
// header goes to the hub's host only and the hub's headers on the redirect are kept.
func (c *Client) get(ctx context.Context, hc *http.Client, rawURL string, offset int64) (*http.Response, linkInfo, error) {
	info := linkInfo{size: -1}
	hubURL, err := url.Parse(rawURL)
	if err != nil {
		return nil, info, err
	}
	u := hubURL
	for hop := 0; ; hop++ {
		if hop > maxRedirects {
			return nil, info, fmt.Errorf("more than %d redirects", maxRedirects)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, info, err
		}
		req.Header.Set("Accept-Encoding", "identity") // byte ranges of the file itself
		if offset > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
		}
		if c.UserAgent != "" {
			req.Header.Set("User-Agent", c.UserAgent)
		}
		if c.Token != "" && strings.EqualFold(u.Host, hubURL.Host) && u.Scheme == hubURL.Scheme {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, info, err
		}
		info.collect(resp.Header)
		switch resp.StatusCode {
		case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			loc, err := resp.Location()
			drain(resp)
			if err != nil {
				return nil, info, fmt.Errorf("redirect from %s without a usable Location: %v", u.Redacted(), err)
			}
			if u.Scheme == "https" && loc.Scheme != "https" {
				return nil, info, fmt.Errorf("refusing a redirect from https to %s", loc.Redacted())
			}
			u = loc
			continue
		}
		return resp, info, nil
	}
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// watchdog cancels a transfer that has been silent for its duration.
type watchdog struct {
	t     *time.Timer
	d     time.Duration
	fired atomic.Bool
}

func newWatchdog(d time.Duration, cancel func()) *watchdog {
	w := &watchdog{d: d}
	w.t = time.AfterFunc(d, func() { w.fired.Store(true); cancel() })
	return w
}

func (w *watchdog) kick() { w.t.Reset(w.d) }
func (w *watchdog) stop() { w.t.Stop() }

// fetch runs one transfer. again: the part was discarded and the caller should start over.
func (c *Client) fetch(ctx context.Context, hc *http.Client, m Model, final string) (res Result, again bool, err error) {
	src := m.URL(c.hub())
	part := final + ".part"
	limit := int64(-1) // the largest file accepted
	if m.Size > 0 {
		limit = m.Size + m.Size/2
	}
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return Result{}, false, err
	}
	closed := false
	defer func() {
		if !closed {
			f.Close()
		}
	}()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return Result{}, false, err
	}
	if limit >= 0 && have > limit {
		c.logf("%s holds more than the file can be: starting over", filepath.Base(part))
		if err := f.Truncate(0); err != nil {
			return Result{}, false, err
		}
		have = 0
	}
	interrupted := func(have int64, e error) error {
		return &InterruptedError{URL: src, Part: part, Have: have, Err: e}
	}

	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := newWatchdog(c.idle(), cancel)
	defer wd.stop()
	stalled := func(e error) error {
		if wd.fired.Load() && ctx.Err() == nil {
			return fmt.Errorf("no data for %v (stalled connection)", c.idle())
		}
		return e
	}

	resp, info, err := c.get(tctx, hc, src, have)
	if err != nil {
		return Result{}, false, interrupted(have, stalled(err))
	}
	defer resp.Body.Close()
	wd.kick()

	total := int64(-1) // the file's size as this response gives it
	switch resp.StatusCode {
	case http.StatusOK:
		total = resp.ContentLength
	case http.StatusPartialContent:
		start, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != have {
			c.logf("the server answered the range request with %q: starting over", resp.Header.Get("Content-Range"))
			return Result{}, true, truncate(f)
		}
		total = size
	case http.StatusRequestedRangeNotSatisfiable:
		// The part reaches the end already (complete), or is not this file (wrong).
		_, size, _ := parseContentRange(resp.Header.Get("Content-Range"))
		if info.size >= 0 {
			size = info.size
		}
		sum, err := hashPrefix(f, have)
		if err != nil {
			return Result{}, false, err
		}
		if size == have && (info.sum() == "" || info.sum() == sum) {
			closed = true
			return c.finish(f, part, final, have, sum, info.sum() != "", have)
		}
		c.logf("%s does not match the file on the hub: starting over", filepath.Base(part))
		return Result{}, true, truncate(f)
	case http.StatusUnauthorized, http.StatusForbidden:
		msg := fmt.Sprintf("%s: access denied (HTTP %d): set HF_TOKEN (or --token) to a Hugging Face token that can read %s", src, resp.StatusCode, m.Repo)
		if c.Token != "" {
			msg = fmt.Sprintf("%s: access denied (HTTP %d): the token (HF_TOKEN or --token) was refused; check that it is valid and can read %s", src, resp.StatusCode, m.Repo)
		}
		return Result{}, false, &HTTPError{URL: src, Status: resp.StatusCode, msg: msg}
	case http.StatusNotFound:
		return Result{}, false, &HTTPError{URL: src, Status: resp.StatusCode,
			msg: fmt.Sprintf("not found (HTTP 404): %s — the hub has no such file (check --hub / HF_ENDPOINT; the catalog may be out of date)", src)}
	default:
		return Result{}, false, &HTTPError{URL: src, Status: resp.StatusCode, msg: fmt.Sprintf("%s: HTTP %s", src, resp.Status)}
	}

	// The expected size: the hub's word first, then the transfer's.
	want := info.size
	switch {
	case want < 0:
		want = total
	case total >= 0 && total != want:
		return Result{}, false, fmt.Errorf("%s: the hub says the file has %d bytes, the transfer %d", src, want, total)
	}
	if limit >= 0 && want > limit {
		return Result{}, false, fmt.Errorf("%s: the file has %s, the catalog expects about %s: refusing it (over 1.5×); voxpipe may be out of date", src, MB(want), MB(m.Size))
	}

	h := sha256.New()
	start := have
	if resp.StatusCode == http.StatusOK {
		if have > 0 {
			c.logf("the server does not resume (it ignored the range request): starting from 0")
		}
		if err := truncate(f); err != nil {
			return Result{}, false, err
		}
		start, have = 0, 0
	} else if have > 0 {
		c.logf("resuming at %s", MB(have))
		if err := hashInto(h, f, have); err != nil {
			return Result{}, false, err
		}
	}
	if c.Progress != nil {
		c.Progress(Progress{Done: have, Total: want, Start: start})
	}

	buf := make([]byte, 256<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			wd.kick()
			if want >= 0 && have+int64(n) > want || limit >= 0 && have+int64(n) > limit {
				_ = truncate(f)
				return Result{}, false, fmt.Errorf("%s: the server sent more than the file's %s: discarded", src, MB(max(want, limit)))
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return Result{}, false, err
			}
			h.Write(buf[:n])
			have += int64(n)
			if c.Progress != nil {
				c.Progress(Progress{Done: have, Total: want, Start: start})
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return Result{}, false, interrupted(have, stalled(rerr))
		}
	}
	if want >= 0 && have < want {
		return Result{}, false, interrupted(have, fmt.Errorf("the connection ended at %d of %d bytes", have, want))
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if exp := info.sum(); exp != "" && sum != exp {
		if start > 0 {
			c.logf("checksum mismatch after resuming (the part was from another version?): starting over")
			return Result{}, true, truncate(f)
		}
		f.Close()
		closed = true
		os.Remove(part)
		return Result{}, false, fmt.Errorf("%s: checksum mismatch: sha256 %s, the hub says %s; the download was removed", src, sum, exp)
	}
	closed = true
	return c.finish(f, part, final, have, sum, info.sum() != "", start)
}

// finish syncs and closes the part and renames it into place.
func (c *Client) finish(f *os.File, part, final string, n int64, sum string, checked bool, resumed int64) (Result, bool, error) {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part, final)
	}
	if err != nil {
		return Result{}, false, err
	}
	if d, err := os.Open(filepath.Dir(final)); err == nil { // make the rename durable
		_ = d.Sync()
		d.Close()
	}
	if !checked {
		sum = ""
	}
	return Result{Path: final, Bytes: n, SHA256: sum, Checked: checked, Resumed: resumed}, false, nil
}

func truncate(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// hashInto feeds the first n bytes of f to h and leaves f positioned at n.
func hashInto(h hash.Hash, f *os.File, n int64) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.CopyN(h, f, n); err != nil {
		return err
	}
	_, err := f.Seek(n, io.SeekStart)
	return err
}

func hashPrefix(f *os.File, n int64) (string, error) {
	h := sha256.New()
	if err := hashInto(h, f, n); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// parseContentRange reads "bytes START-END/SIZE" (or "bytes */SIZE"); size is -1 for "*".
func parseContentRange(v string) (start, size int64, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !found {
		return 0, -1, false
	}
	rng, sz, found := strings.Cut(rest, "/")
	if !found {
		return 0, -1, false
	}
	size = -1
	if sz != "*" {
		n, err := strconv.ParseInt(sz, 10, 64)
		if err != nil {
			return 0, -1, false
		}
		size = n
	}
	if rng == "*" {
		return 0, size, true
	}
	a, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, size, false
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return 0, size, false
	}
	return start, size, true
}

// IsInterrupted reports whether err is a download that the same pull again resumes.
func IsInterrupted(err error) bool {
	var ie *InterruptedError
	return errors.As(err, &ie)
}
