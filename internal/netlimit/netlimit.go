// Package netlimit caps how many connections one client address may hold open at once, so
// a single client cannot exhaust the server's file descriptors or goroutines with idle or
// slow connections.
package netlimit

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Listener wraps a net.Listener: a connection from an address that already holds PerAddr
// open connections is closed as soon as it is accepted, and Accept goes on to the next.
type Listener struct {
	net.Listener
	perAddr int
	// OnRefuse, if set, is called (from Accept) with each refused connection's address.
	OnRefuse func(addr net.Addr)

	mu      sync.Mutex
	open    map[string]int
	conns   map[*conn]struct{}
	refused atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// New wraps ln; perAddr ≤ 0 means no limit.
func New(ln net.Listener, perAddr int) *Listener {
	return &Listener{Listener: ln, perAddr: perAddr, open: map[string]int{}, conns: map[*conn]struct{}{}}
}

// Accept returns the next connection whose address is under its limit.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		l.mu.Lock()
		if l.perAddr > 0 && l.open[host] >= l.perAddr {
			l.mu.Unlock()
			l.refused.Add(1)
			c.Close()
			if l.OnRefuse != nil {
				l.OnRefuse(c.RemoteAddr())
			}
			continue
		}
		l.open[host]++
		tc := &conn{Conn: c, l: l, host: host}
		l.conns[tc] = struct{}{}
		l.mu.Unlock()
		return tc, nil
	}
}

// Close closes the listener once; later calls return nil (http.Server.Shutdown closes it
// again after the caller stopped accepting).
func (l *Listener) Close() error {
	first := false
	l.closeOnce.Do(func() { first, l.closeErr = true, l.Listener.Close() })
	if first {
		return l.closeErr
	}
	return nil
}

// Open is the number of connections now open from host (an IP).
func (l *Listener) Open(host string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[host]
}

// Refused is the number of connections refused so far.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// CloseAll closes every connection still open, hijacked ones (WebSockets) included, which
// http.Server.Close does not track: the last step of a bounded shutdown.
func (l *Listener) CloseAll() {
	l.mu.Lock()
	cs := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		cs = append(cs, c)
	}
	l.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

func (l *Listener) release(c *conn) {
	host := c.host
	l.mu.Lock()
	delete(l.conns, c)
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host) // the map holds only addresses with open connections
	}
	l.mu.Unlock()
}

// hostOf is the IP of a TCP address (every port of a client counts together).
func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// conn gives its slot back on its first Close (net/http and WebSocket code may close twice).
type conn struct {
	net.Conn
	l    *Listener
	host string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// CloseWrite keeps net/http's half-close before closing a connection (it lets the client
// read the last response instead of getting a reset).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ReadFrom keeps the kernel copy (sendfile, splice) that *net.TCPConn offers.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}
