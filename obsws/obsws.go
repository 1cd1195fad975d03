// Package obsws is a small obs-websocket v5 client: it connects to OBS Studio (Tools →
// WebSocket Server Settings), authenticates with the server password, and sets an input's
// audio sync offset so OBS delays its other sources by the voice pipeline's measured latency.
package obsws

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Opcodes of the obs-websocket v5 protocol.
const (
	opHello           = 0
	opIdentify        = 1
	opIdentified      = 2
	opRequest         = 6
	opRequestResponse = 7
)

type message struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
}

// Client is a connection to OBS. Requests may come from several goroutines.
type Client struct {
	conn    *websocket.Conn
	mu      sync.Mutex // serialises writes and the pending map
	pending map[string]chan response
	nextID  atomic.Uint64
	done    chan struct{}
	err     error
}

type response struct {
	Status struct {
		Result  bool   `json:"result"`
		Code    int    `json:"code"`
		Comment string `json:"comment"`
	} `json:"requestStatus"`
	Data json.RawMessage `json:"responseData"`
}

// Dial connects to url (ws://host:4455) and identifies, answering OBS's authentication
// challenge with password when the server asks for one.
func Dial(ctx context.Context, url, password string) (*Client, error) {
	d := websocket.Dialer{Subprotocols: []string{"obswebsocket.json"}, HandshakeTimeout: 5 * time.Second}
	conn, _, err := d.DialContext(ctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("obs-websocket: connect %s: %w", url, err)
	}
	fail := func(err error) (*Client, error) {
		conn.Close()
		return nil, fmt.Errorf("obs-websocket: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	var hello struct {
		RPC  int `json:"rpcVersion"`
		Auth *struct {
			Challenge string `json:"challenge"`
			Salt      string `json:"salt"`
		} `json:"authentication"`
	}
	if err := readOp(conn, opHello, &hello); err != nil {
		return fail(err)
	}
	id := map[string]any{"rpcVersion": 1, "eventSubscriptions": 0}
	if hello.Auth != nil {
		if password == "" {
			return fail(errors.New("the server needs a password (set it in the environment)"))
		}
		id["authentication"] = authString(password, hello.Auth.Salt, hello.Auth.Challenge)
	}
	if err := conn.WriteJSON(map[string]any{"op": opIdentify, "d": id}); err != nil {
		return fail(err)
	}
	if err := readOp(conn, opIdentified, nil); err != nil {
		if ce := (*websocket.CloseError)(nil); errors.As(err, &ce) && ce.Code == 4009 {
			return fail(errors.New("authentication failed: wrong password"))
		}
		return fail(err)
	}
	conn.SetReadDeadline(time.Time{})
	c := &Client{conn: conn, pending: map[string]chan response{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// authString is the v5 answer: base64(sha256(base64(sha256(password + salt)) + challenge)).
func authString(password, salt, challenge string) string {
	secret := sha256.Sum256([]byte(password + salt))
	s := base64.StdEncoding.EncodeToString(secret[:])
	auth := sha256.Sum256([]byte(s + challenge))
	return base64.StdEncoding.EncodeToString(auth[:])
}

func readOp(conn *websocket.Conn, op int, into any) error {
	var m message
	if err := conn.ReadJSON(&m); err != nil {
		return err
	}
	if m.Op != op {
		return fmt.Errorf("expected op %d, got op %d", op, m.Op)
	}
	if into != nil {
		return json.Unmarshal(m.D, into)
	}
	return nil
}

// read dispatches responses until the connection ends.
func (c *Client) read() {
	defer close(c.done)
	for {
		var m message
		if err := c.conn.ReadJSON(&m); err != nil {
			c.mu.Lock()
			c.err = err
			for id, ch := range c.pending {
				close(ch)
				delete(c.pending, id)
			}
			c.mu.Unlock()
			return
		}
		if m.Op != opRequestResponse {
			continue // events and other traffic are not used
		}
		var r struct {
			ID string `json:"requestId"`
			response
		}
		if json.Unmarshal(m.D, &r) != nil {
			continue
		}
		c.mu.Lock()
		ch := c.pending[r.ID]
		delete(c.pending, r.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r.response
		}
	}
}

// Request sends one request and waits for its response.
func (c *Client) Request(ctx context.Context, typ string, data any) (json.RawMessage, error) {
	id := strconv.FormatUint(c.nextID.Add(1), 10)
	ch := make(chan response, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("obs-websocket: connection closed: %w", c.err)
	}
	c.pending[id] = ch
	err := c.conn.WriteJSON(map[string]any{"op": opRequest, "d": map[string]any{"requestType": typ, "requestId": id, "requestData": data}})
	c.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("obs-websocket: %s: %w", typ, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("obs-websocket: %s: connection closed", typ)
		}
		if !r.Status.Result {
			return nil, fmt.Errorf("obs-websocket: %s failed (code %d): %s", typ, r.Status.Code, r.Status.Comment)
		}
		return r.Data, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// SetAudioSyncOffset sets an input's audio sync offset (OBS accepts −950 ms … 20 s).
func (c *Client) SetAudioSyncOffset(ctx context.Context, input string, offset time.Duration) error {
	ms := offset.Milliseconds()
	if ms < -950 || ms > 20000 {
		return fmt.Errorf("obs-websocket: sync offset %d ms is outside OBS's −950…20000 ms", ms)
	}
	_, err := c.Request(ctx, "SetInputAudioSyncOffset", map[string]any{"inputName": input, "inputAudioSyncOffset": ms})
	return err
}

// Close ends the connection.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
