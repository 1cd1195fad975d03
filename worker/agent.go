package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/livekit/protocol/auth"
	"github.com/livekit/protocol/livekit"
	"google.golang.org/protobuf/proto"
)

// Run registers the worker with LiveKit as an agent worker and takes the jobs it is
// dispatched until ctx ends (or Close), reconnecting with a backoff when the connection is
// lost. It returns nil when ctx ends, and an error only for a refusal that retrying cannot
// fix (bad credentials).
func (w *Worker) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // Close ends Run too
		select {
		case <-w.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := time.Second
	for {
		start := time.Now()
		err := w.session(ctx)
		w.mu.Lock()
		w.workerID, w.agentErr = "", err
		w.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		var refused *refusedError
		if errors.As(err, &refused) && (refused.status == http.StatusUnauthorized || refused.status == http.StatusForbidden) {
			return err
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		w.cfg.Logger.Warn("LiveKit agent connection lost; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// refusedError is an HTTP answer other than the upgrade.
type refusedError struct {
	status int
	body   string
}

func (e *refusedError) Error() string {
	msg := fmt.Sprintf("LiveKit refused the agent connection: %d %s", e.status, http.StatusText(e.status))
	if e.body != "" {
		msg += ": " + e.body
	}
	if e.status == http.StatusUnauthorized || e.status == http.StatusForbidden {
		msg += " (check the API key and secret)"
	}
	return msg
}

// agentURL is the worker endpoint of a LiveKit server URL.
func agentURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/agent"
	return u.String(), nil
}

// conn is one registration: the socket and its serialised writer.
type agentConn struct {
	ws *websocket.Conn
	mu sync.Mutex
}

const agentWriteTimeout = 10 * time.Second

func (c *agentConn) send(m *livekit.WorkerMessage) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ws.SetWriteDeadline(time.Now().Add(agentWriteTimeout))
	return c.ws.WriteMessage(websocket.BinaryMessage, b)
}

// session runs one registration until the connection fails or ctx ends.
func (w *Worker) session(ctx context.Context) error {
	u, err := agentURL(w.cfg.URL)
	if err != nil {
		return err
	}
	token, err := auth.NewAccessToken(w.cfg.APIKey, w.cfg.APISecret).
		SetVideoGrant(&auth.VideoGrant{Agent: true}).SetValidFor(time.Hour).ToJWT()
	if err != nil {
		return err
	}
	dialer := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	ws, resp, err := dialer.DialContext(ctx, u, http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		if resp != nil {
			var body [256]byte
			n, _ := resp.Body.Read(body[:])
			resp.Body.Close()
			return &refusedError{status: resp.StatusCode, body: strings.TrimSpace(string(body[:n]))}
		}
		return fmt.Errorf("connect to %s: %w", u, err)
	}
	defer ws.Close()
	ws.SetReadLimit(1 << 20)
	c := &agentConn{ws: ws}
	go func() { // unblock the reader when the worker stops
		<-ctx.Done()
		c.mu.Lock()
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "worker stopping"), time.Now().Add(time.Second))
		c.mu.Unlock()
		ws.Close()
	}()

	err = c.send(&livekit.WorkerMessage{Message: &livekit.WorkerMessage_Register{Register: &livekit.RegisterWorkerRequest{
		Type: livekit.JobType_JT_ROOM, AgentName: w.cfg.AgentName, Version: w.cfg.Version,
		PingInterval: uint32(w.cfg.StatusInterval.Seconds() + 1),
	}}})
	if err != nil {
		return err
	}
	// Anything, a ping included, within a few status intervals keeps the connection alive.
	idle := 3*w.cfg.StatusInterval + 10*time.Second
	ws.SetReadDeadline(time.Now().Add(idle))
	ws.SetPingHandler(func(data string) error {
		ws.SetReadDeadline(time.Now().Add(idle))
		c.mu.Lock()
		defer c.mu.Unlock()
		return ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(agentWriteTimeout))
	})
	stop := make(chan struct{})
	defer close(stop)
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		ws.SetReadDeadline(time.Now().Add(idle))
		var m livekit.ServerMessage
		if err := proto.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("bad message from LiveKit: %w", err)
		}
		switch msg := m.Message.(type) {
		case *livekit.ServerMessage_Register:
			w.mu.Lock()
			w.workerID, w.agentErr = msg.Register.GetWorkerId(), nil
			w.mu.Unlock()
			w.cfg.Logger.Info("registered with LiveKit", "worker_id", msg.Register.GetWorkerId(), "url", w.cfg.URL,
				"agent_name", w.cfg.AgentName, "server_version", msg.Register.GetServerInfo().GetVersion())
			go w.reportStatus(c, stop)
		case *livekit.ServerMessage_Availability:
			w.offer(c, msg.Availability)
		case *livekit.ServerMessage_Assignment:
			go w.assign(c, msg.Assignment)
		case *livekit.ServerMessage_Termination:
			for _, r := range w.Rooms() {
				if r.job == msg.Termination.GetJobId() {
					go r.leave("job terminated by LiveKit")
				}
			}
		}
	}
}

// reportStatus tells LiveKit the worker's load every StatusInterval (dispatch weighs workers
// by it) and pings.
func (w *Worker) reportStatus(c *agentConn, stop <-chan struct{}) {
	t := time.NewTicker(w.cfg.StatusInterval)
	defer t.Stop()
	for {
		capa := w.Capacity()
		status := livekit.WorkerStatus_WS_AVAILABLE
		if !capa.Accepting {
			status = livekit.WorkerStatus_WS_FULL
		}
		err := c.send(&livekit.WorkerMessage{Message: &livekit.WorkerMessage_UpdateWorker{UpdateWorker: &livekit.UpdateWorkerStatus{
			Status: &status, Load: float32(capa.Load), JobCount: uint32(capa.Rooms)}}})
		if err == nil {
			err = c.send(&livekit.WorkerMessage{Message: &livekit.WorkerMessage_Ping{Ping: &livekit.WorkerPing{Timestamp: time.Now().UnixMilli()}}})
		}
		if err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// offerHold is how long a room stays reserved for a job the worker accepted before its
// assignment comes.
const offerHold = 30 * time.Second

// offer answers LiveKit's question whether the worker takes a job.
func (w *Worker) offer(c *agentConn, req *livekit.AvailabilityRequest) {
	job := req.GetJob()
	resp := &livekit.AvailabilityResponse{JobId: job.GetId()}
	log := w.cfg.Logger.With("job", job.GetId(), "room", job.GetRoom().GetName())
	if opts, err := ParseOptions(job.GetMetadata()); err != nil {
		log.Warn("declined a job", "err", err)
	} else if !w.admit(opts.liveVoice(w.cfg.DefaultVoice)) {
		log.Info("declined a job: the worker is full", "capacity", w.Capacity())
	} else {
		resp.Available = true
		resp.ParticipantIdentity = "voxpipe-" + randomID()
		resp.ParticipantName = "voxpipe"
		w.holdOffer(job.GetId())
	}
	if err := c.send(&livekit.WorkerMessage{Message: &livekit.WorkerMessage_Availability{Availability: resp}}); err != nil {
		log.Debug("availability", "err", err)
	}
}

// holdOffer keeps the room admit reserved until the assignment takes it, or offerHold ends.
func (w *Worker) holdOffer(job string) {
	w.mu.Lock()
	if w.offers == nil {
		w.offers = map[string]*time.Timer{}
	}
	w.offers[job] = time.AfterFunc(offerHold, func() {
		if w.takeOffer(job) {
			w.admitted()
		}
	})
	w.mu.Unlock()
}

// takeOffer removes a held offer; false if there is none (it timed out, or never was).
func (w *Worker) takeOffer(job string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.offers[job]
	if ok {
		t.Stop()
		delete(w.offers, job)
	}
	return ok
}

// assign joins the room of an assigned job and tells LiveKit how it went.
func (w *Worker) assign(c *agentConn, a *livekit.JobAssignment) {
	job := a.GetJob()
	opts, err := ParseOptions(job.GetMetadata())
	held := w.takeOffer(job.GetId())
	if !held && !w.admit(opts.liveVoice(w.cfg.DefaultVoice)) {
		w.jobStatus(c, job.GetId(), errors.New("the worker is full"))
		return
	}
	defer w.admitted()
	if err == nil {
		url := a.GetUrl()
		if url == "" {
			url = w.cfg.URL
		}
		onLeave := func() { w.jobStatus(c, job.GetId(), nil) }
		if _, err = w.enter(url, a.GetToken(), job.GetRoom().GetName(), job.GetId(), opts, onLeave); err == nil {
			return
		}
	}
	w.cfg.Logger.Warn("job failed", "job", job.GetId(), "room", job.GetRoom().GetName(), "err", err)
	w.jobStatus(c, job.GetId(), err)
}

// jobStatus reports a job's end: success, or failure with err.
func (w *Worker) jobStatus(c *agentConn, job string, err error) {
	u := &livekit.UpdateJobStatus{JobId: job, Status: livekit.JobStatus_JS_SUCCESS}
	if err != nil {
		u.Status, u.Error = livekit.JobStatus_JS_FAILED, err.Error()
	}
	c.send(&livekit.WorkerMessage{Message: &livekit.WorkerMessage_UpdateJob{UpdateJob: u}})
}
