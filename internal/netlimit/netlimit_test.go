package netlimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echoServer serves ln with an echo of each line, until ln closes.
func echoServer(t *testing.T, l *Listener) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		l.CloseAll()
		wg.Wait()
	})
}

func dialEcho(t *testing.T, addr string) (net.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hi\n")); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// TestPerAddressLimit: the connection over the limit is closed at once (the client reads
// EOF or a reset, not a timeout) while the others still work, and a slot freed by a close is
// reusable.
func TestPerAddressLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, 2)
	echoServer(t, l)
	addr := ln.Addr().String()
	var open []net.Conn
	for range 2 {
		c, err := dialEcho(t, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, c)
	}
	_, err = dialEcho(t, addr)
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("third connection: %v, want it closed by the server", err)
	}
	if l.Refused() != 1 || l.Open("127.0.0.1") != 2 {
		t.Errorf("refused %d, open %d", l.Refused(), l.Open("127.0.0.1"))
	}
	if _, err := open[0].Write([]byte("still\n")); err != nil {
		t.Fatal(err)
	}
	if s, err := bufio.NewReader(open[0]).ReadString('\n'); err != nil || s != "still\n" {
		t.Fatalf("open connection: %q %v", s, err)
	}
	open[1].Close() // the server's copy ends, its Close frees the slot
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := dialEcho(t, addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot not freed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l.Close() != nil || l.Close() != nil {
		t.Error("Close is not idempotent")
	}
}
