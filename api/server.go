package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
)

// Limits of the HTTP layer.
const (
	MaxBatchMessages = 1000
	MaxBatchBytes    = 16 << 20
	maxBodyBytes     = MaxBatchBytes + 1<<20 // JSON and base64 overhead
	defaultTimeout   = 10 * time.Second
	maxTimeout       = 5 * time.Minute
	maxWait          = 5 * time.Minute
	forwardHeader    = "Mq-Forward-Hops"
	maxForwardHops   = 2
)

// Server serves mqd's HTTP API for one node.
type Server struct {
	node    *raftfsm.Node
	logger  *slog.Logger
	srv     *fasthttp.Server
	fwd     *fasthttp.Client
	waiters *waiters
	metrics *metrics
	cfgs    cfgCache
	rr      atomic.Uint32 // round-robin partition choice
}

// New builds a server for node.
func New(node *raftfsm.Node, logger *slog.Logger) *Server {
	s := &Server{node: node, logger: logger, waiters: newWaiters()}
	s.metrics = newMetrics(s)
	node.FSM.Notify = s.waiters.wake
	s.fwd = &fasthttp.Client{
		MaxConnsPerHost:     4096,
		ReadTimeout:         maxWait + time.Minute,
		WriteTimeout:        30 * time.Second,
		MaxIdleConnDuration: time.Minute,
		RetryIfErr:          func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
	}
	s.srv = &fasthttp.Server{
		Handler:                      s.handle,
		ErrorHandler:                 s.parseError,
		Name:                         "mqd",
		MaxRequestBodySize:           maxBodyBytes,
		ReadBufferSize:               64 << 10,
		ReadTimeout:                  maxWait + time.Minute,
		IdleTimeout:                  2 * time.Minute,
		DisablePreParseMultipartForm: true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
	}
	return s
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// Shutdown stops accepting and waits for in-flight requests (or ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	s.waiters.closeAll()
	return s.srv.ShutdownWithContext(ctx)
}

func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fmt.Errorf("%w: body over %d bytes", ErrBodyTooLarge, maxBodyBytes))
		return
	}
	writeError(ctx, fmt.Errorf("%w: %v", ErrBadRequest, err))
}

// route is a parsed request path.
type route struct {
	topic, group string
	action       string // after the group or topic: "messages", "messages:batch", "fetch", ...
	dlqID        string
	leaderOnly   bool
	ctx          context.Context // the request's deadline, for leader routes
	handler      func(*fasthttp.RequestCtx, *route) error
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	r, err := s.match(ctx)
	if err == nil {
		if r.leaderOnly {
			err = s.onLeader(ctx, r)
		} else {
			err = r.handler(ctx, r)
		}
	}
	if err != nil {
		writeError(ctx, err)
	}
	s.metrics.observeRequest(ctx.Response.StatusCode())
}

// match parses the path and method into a route.
func (s *Server) match(ctx *fasthttp.RequestCtx) (*route, error) {
	path := string(ctx.Path())
	m := string(ctx.Method())
	only := func(method string, h func(*fasthttp.RequestCtx, *route) error, leader bool) (*route, error) {
		if m != method {
			return nil, fmt.Errorf("%w: %s %s", ErrMethod, m, path)
		}
		return &route{handler: h, leaderOnly: leader}, nil
	}
	switch path {
	case "/healthz":
		return only("GET", s.healthz, false)
	case "/readyz":
		return only("GET", s.readyz, false)
	case "/metrics":
		return only("GET", s.metricsHandler, false)
	case "/v1/cluster":
		return only("GET", s.cluster, false)
	case "/v1/internal/status":
		return only("GET", s.status, false)
	case "/v1/internal/join":
		return only("POST", s.join, true)
	case "/v1/topics", "/v1/topics/":
		return only("GET", s.listTopics, true)
	}
	if strings.HasPrefix(path, "/debug/pprof/") {
		return only(m, func(ctx *fasthttp.RequestCtx, _ *route) error { pprofhandler.PprofHandler(ctx); return nil }, false)
	}
	rest, ok := strings.CutPrefix(path, "/v1/topics/")
	if !ok {
		return nil, fmt.Errorf("%w: no route %s", ErrNotFound, path)
	}
	parts := strings.Split(rest, "/")
	r := &route{topic: parts[0], leaderOnly: true}
	if !mlog.ValidName(r.topic) {
		return nil, fmt.Errorf("%w: topic %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, r.topic)
	}
	var h func(*fasthttp.RequestCtx, *route) error
	want := ""
	switch {
	case len(parts) == 1:
		switch m {
		case "PUT":
			h = s.putTopic
		case "GET":
			h = s.getTopic
		case "DELETE":
			h = s.deleteTopic
		default:
			return nil, fmt.Errorf("%w: %s %s", ErrMethod, m, path)
		}
		want = m
	case len(parts) == 2 && parts[1] == "messages":
		h, want = s.publish, "POST"
	case len(parts) == 2 && parts[1] == "messages:batch":
		h, want = s.publishBatch, "POST"
	case len(parts) >= 3 && parts[1] == "groups":
		r.group = parts[2]
		if !mlog.ValidName(r.group) {
			return nil, fmt.Errorf("%w: group %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, r.group)
		}
		h, want = s.groupRoute(parts[3:], m)
		if len(parts) == 5 && parts[3] == "dlq" {
			r.dlqID = parts[4] // DELETE .../dlq/{id}
		}
	}
	if h == nil {
		return nil, fmt.Errorf("%w: no route %s %s", ErrNotFound, m, path)
	}
	if m != want {
		return nil, fmt.Errorf("%w: %s %s", ErrMethod, m, path)
	}
	r.handler = h
	return r, nil
}

func (s *Server) groupRoute(rest []string, m string) (func(*fasthttp.RequestCtx, *route) error, string) {
	if len(rest) == 0 {
		switch m {
		case "DELETE":
			return s.deleteGroup, m
		default:
			return s.putGroup, "PUT"
		}
	}
	if rest[0] == "dlq" {
		switch {
		case len(rest) == 1:
			return s.listDeadLetters, "GET"
		case len(rest) == 2 && rest[1] == "replay":
			return s.replayDeadLetters, "POST"
		case len(rest) == 2:
			return s.deleteDeadLetter, "DELETE"
		}
		return nil, ""
	}
	if len(rest) != 1 {
		return nil, ""
	}
	switch rest[0] {
	case "fetch":
		return s.fetch, "POST"
	case "ack":
		return s.ack, "POST"
	case "nack":
		return s.nack, "POST"
	case "extend":
		return s.extend, "POST"
	}
	return nil, ""
}

// deadline is the request's context: Mq-Timeout-Ms or 10 s, plus the
// time a long-polling fetch may wait.
func deadline(ctx *fasthttp.RequestCtx) (context.Context, context.CancelFunc, error) {
	d := defaultTimeout
	if v := ctx.Request.Header.Peek("Mq-Timeout-Ms"); len(v) > 0 {
		ms, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || ms < 1 || ms > int64(maxTimeout/time.Millisecond) {
			return nil, nil, fmt.Errorf("%w: Mq-Timeout-Ms must be an integer in [1, %d]", ErrBadHeader, maxTimeout/time.Millisecond)
		}
		d = time.Duration(ms) * time.Millisecond
	}
	c, cancel := context.WithTimeout(context.Background(), d+fetchWait(ctx))
	return c, cancel, nil
}

// onLeader runs a route's handler on the leader: here if this node leads,
// else by forwarding the request. A handler that finds leadership gone
// before its command was proposed (ErrNotLeader: nothing changed) is
// retried through the new leader.
func (s *Server) onLeader(ctx *fasthttp.RequestCtx, r *route) error {
	rctx, cancel, err := deadline(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	r.ctx = rctx
	for {
		if s.node.IsLeader() {
			if !s.node.Serving() {
				// Newly elected: wait until it has applied the log before it.
				if err := pause(rctx, 5*time.Millisecond); err != nil {
					return fmt.Errorf("%w: the new leader is still applying the log", raftfsm.ErrNotLeader)
				}
				continue
			}
			err := r.handler(ctx, r)
			if !errors.Is(err, raftfsm.ErrNotLeader) {
				return err
			}
			ctx.Response.Reset()
		}
		if !s.node.WaitLeader(rctx) {
			return fmt.Errorf("%w: no leader elected within the request's deadline", raftfsm.ErrNoQuorum)
		}
		if s.node.IsLeader() {
			continue
		}
		err := s.forward(rctx, ctx)
		if !errors.Is(err, errLeaderUnreachable) {
			return err
		}
		// The request never reached the leader: wait for it to come back
		// or for a new one, within the deadline.
		if pause(rctx, 50*time.Millisecond) != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
}

// pause sleeps for d, or answers ctx's error if it ends first.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errLeaderUnreachable means a forward could not connect: nothing was sent.
var errLeaderUnreachable = errors.New("leader unreachable")

// forward proxies the request to the leader and copies its answer back.
func (s *Server) forward(rctx context.Context, ctx *fasthttp.RequestCtx) error {
	hops, _ := strconv.Atoi(string(ctx.Request.Header.Peek(forwardHeader)))
	if hops >= maxForwardHops {
		return fmt.Errorf("%w: leadership is changing, retry", raftfsm.ErrNotLeader)
	}
	_, addr, ok := s.node.Leader()
	if !ok {
		return fmt.Errorf("%w: leader address unknown", raftfsm.ErrNotLeader)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.CopyTo(req)
	req.SetHost(addr)
	req.URI().SetScheme("http")
	req.Header.Set(forwardHeader, strconv.Itoa(hops+1))
	dl, _ := rctx.Deadline()
	resp := &ctx.Response
	if err := s.fwd.DoDeadline(req, resp, dl); err != nil {
		resp.Reset()
		if isDialError(err) {
			return fmt.Errorf("%w: %s: %v", errLeaderUnreachable, addr, err)
		}
		return fmt.Errorf("%w: forward to leader %s: %v", ErrUnavailable, addr, err)
	}
	return nil
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		(errors.As(err, &op) && op.Op == "dial")
}

// fetchWait is how long a forwarded fetch may legitimately wait.
func fetchWait(ctx *fasthttp.RequestCtx) time.Duration {
	if !bytes.HasSuffix(ctx.Path(), []byte("/fetch")) {
		return 0
	}
	var f struct {
		WaitMs int64 `json:"wait_ms"`
	}
	_ = decodeLoose(ctx.PostBody(), &f)
	return time.Duration(min(max(f.WaitMs, 0), int64(maxWait/time.Millisecond))) * time.Millisecond
}
