package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/raftfsm"
	"github.com/mqd/mqd/replica"
	"github.com/mqd/mqd/tlsconf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
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
	// maxForwardHops bounds forwarding loops while leadership moves: a
	// request may go from any node to the metadata leader (a topic's
	// creation), to a member of the topic's data group, to its leader.
	maxForwardHops = 3
	// forwardLoopHeader marks the answer of a request refused for
	// maxForwardHops: nothing was done, so the node it entered by (hop 0)
	// treats it as a leader it could not reach and tries again within the
	// request's deadline (errForwardLoop), rather than pass a 503 on. A
	// data group's leadership moves just after the group is made (its
	// election, then the hand-off to its preferred leader), while its
	// first topic's creation is forwarded to it.
	forwardLoopHeader = "Mq-Forward-Loop"
	// maxHandOffWait bounds how long a request on a stopping leader waits
	// for another node to take the leadership.
	maxHandOffWait = 2 * time.Second
	readBufferSize = 32 << 10 // also the largest request head fasthttp reads
)

// Options are the server's security settings.
type Options struct {
	// Auth holds the tokens of --auth-file; nil serves without tokens.
	Auth *auth.Store
	// TLS, when set, is the node's TLS material: the server is then
	// reached over HTTPS (the caller wraps its listener), forwards to the
	// leader with mutual TLS, and node-to-node routes accept a client
	// certificate that verified against the cluster's CA (without auth,
	// only that).
	TLS *tlsconf.Store
	// Pprof serves Go profiles at /debug/pprof/ (--pprof); off, those
	// routes answer 404.
	Pprof bool
	// Rates limits requests per token and per connection.
	Rates RateLimits
	// Limits bound client connections; zero fields take DefaultLimits.
	Limits Limits
	// NoGroupSeries leaves the per-group series of the state out of
	// /metrics (--metrics-group-series=false): a scrape then reads no
	// group, for states whose groups are too many to scrape.
	NoGroupSeries bool
	// NodeToken is the bearer token (with the cluster permission) this
	// node sends on node-to-node requests when TLS is off (--node-token):
	// coalesced forwards to the leader carry it.
	NodeToken string
	// CoalesceForward makes a follower send publishes to the leader
	// coalesced (--forward-coalesce, on by default; coalesce.go). Every
	// node serves the internal route whatever it is.
	CoalesceForward bool
	// DataGroups makes the metadata leader place every new topic in a
	// data group (--data-groups; views.go) instead of the default group.
	// A topic placed in one is served from it whatever the flag.
	DataGroups bool
}

// Server serves mqd's HTTP API for one node. A Server is also the view of
// one data group's requests (views.go): node and state are then that
// group's, and everything else (core) is the node's server's.
type Server struct {
	*core
	node  Node
	state State
	cfgs  cfgCache
	// table is this view's routes, their handlers bound to it (a data
	// group's view; nil for the node's server, whose router holds them).
	table []Route
	group string // the data group this view is of; "" for the node's server
}

// core is what a node's server and its data groups' views share.
type core struct {
	opts       Options
	limits     *limiters
	logger     *slog.Logger
	srv        *fasthttp.Server
	fwd        *fasthttp.Client
	coal       coalescer     // coalesced forwarding, a follower's (coalesce.go)
	streams    leaderStreams // coalesced forwarding, the followers' streams a leader serves (fwdstream.go)
	waiters    *waiters
	metrics    *metrics
	router     *router
	connLimits Limits
	conns      *connLimiter
	budget     *bodyBudget
	polls      prometheus.Gauge        // parked long-polls
	pollFwd    chan struct{}           // slots for long-polls' short forwards: half the pool
	rr         atomic.Uint32           // round-robin partition choice
	loud       loudLimiter             // spaces out 5xx warnings (requestlog.go)
	series     map[string]*routeSeries // per route pattern (reqmetrics.go)
	views      views                   // data groups' views (views.go)
	top        *Server                 // the node's server (its views' too)
}

// New builds a server for node and the state machine it replicates.
func New(node *raftfsm.Node, logger *slog.Logger, opts Options) *Server {
	return newServer(node, node.FSM, logger, opts)
}

// newServer builds a server on any Node and State (an in-process test's).
func newServer(node Node, state State, logger *slog.Logger, opts Options) *Server {
	s := &Server{node: node, state: state, core: &core{logger: logger, opts: opts, waiters: newWaiters(), limits: newLimiters(opts.Rates),
		connLimits: opts.Limits.withDefaults()}}
	s.top = s
	s.conns = newConnLimiter(s.connLimits, logger)
	s.budget = newBodyBudget(s.connLimits.BodyBudget)
	s.conns.tls = opts.TLS != nil
	s.polls = newPollGauge()
	s.pollFwd = make(chan struct{}, max(1, s.connLimits.ForwardConns/2))
	s.metrics = newMetrics(s)
	table := s.routes()
	rt, err := newRouter(table)
	if err != nil {
		panic(err) // the table is a constant of the program
	}
	s.router = rt
	s.coal.s = s
	s.series = routeSeriesFor(table)
	state.OnNotify(s.waiters.wake)
	s.fwd = newForwardClient(s.connLimits, opts.TLS)
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		ConnState:          s.limits.connState,
		ErrorHandler:       s.parseError,
		Name:               "mqd",
		MaxRequestBodySize: maxBodyBytes,
		ReadBufferSize:     readBufferSize,
		// ReadTimeout: to the first byte of a new connection's request, and
		// from it to the end of the head; HeaderReceived gives the body more.
		ReadTimeout:    s.connLimits.ReadTimeout,
		HeaderReceived: s.bodyTimeout,
		WriteTimeout:   30 * time.Second,
		IdleTimeout:    s.connLimits.IdleTimeout,
		// Read buffers go back to the pool while a handler runs and while a
		// connection idles: a parked long-poll or an idle keep-alive
		// connection holds no 32 KiB buffer.
		ReduceMemoryUsage:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
		Logger:                       fasthttpLogger{logger},
	}
	return s
}

// bodyTimeout gives a request's body ReadTimeout plus its length at
// bodyMinRate (a chunked body: the largest one's), from the end of its
// head: a client that sends slower than that is cut off.
// It also admits the body against the in-flight byte budget.
func (s *Server) bodyTimeout(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if s.budget.admit(h) {
		// Refused: a limit below the body's length makes fasthttp answer
		// (parseError) without reading it.
		return fasthttp.RequestConfig{MaxRequestBodySize: 1}
	}
	n := h.ContentLength()
	if n < 0 || n > maxBodyBytes { // chunked; or refused unread (413)
		n = maxBodyBytes
	}
	return fasthttp.RequestConfig{ReadTimeout: s.connLimits.ReadTimeout + time.Duration(n)*time.Second/bodyMinRate}
}

// Serve serves on ln until Shutdown. Wrap ln with LimitListener first
// (under TLS, if any) for the connection limits.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// LimitListener wraps a TCP listener with the server's connection limits
// and its accept-error backoff.
func (s *Server) LimitListener(ln net.Listener) net.Listener { return s.conns.wrap(ln) }

// Shutdown stops accepting and waits for in-flight requests (or ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	s.waiters.closeAll()
	s.streams.stop(ctx.Done())
	return s.srv.ShutdownWithContext(ctx)
}

// handle answers one request: match the route, authorize the caller
// (before anything about the request is validated or looked up, so that a
// refused caller learns nothing about what exists), validate the names, run.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer s.budget.release(&ctx.Request.Header)
	start := time.Now()
	var idBuf requestIDBuf
	id := requestID(ctx, idBuf[:0])
	r := routePool.Get().(*route)
	defer func() { *r = route{}; routePool.Put(r) }()
	err := s.admit(ctx)
	if err == nil {
		err = s.router.match(ctx.Method(), string(ctx.URI().PathOriginal()), r)
		if err != nil {
			// No such route: that too is only for known callers.
			if aerr := s.authenticate(ctx, r); aerr != nil {
				err = aerr
			}
		} else if err = s.authorize(ctx, r); err == nil {
			err = r.validate()
		}
		if err == nil {
			err = r.checkQuery(ctx.QueryArgs())
		}
	}
	if err == nil && r.id != nil {
		err = s.limits.token(r.id.Name())
	}
	if err == nil {
		var stale bool
		if stale, err = staleAsked(ctx, r); err == nil { // else a bad ?stale= value: answered below
			err = s.dispatch(ctx, r, stale)
		}
	}
	if err != nil {
		if r.allow != "" && errors.Is(err, ErrMethod) {
			ctx.Response.Header.Set("Allow", r.allow)
		}
		writeError(ctx, err)
	}
	pattern := "unmatched" // the metrics' route label: a pattern, never a path
	if r.def != nil {
		pattern = r.def.Pattern
	}
	ctx.Response.Header.SetBytesV(RequestIDHeader, id)
	took := time.Since(start)
	s.observeRoute(pattern, ctx.Response.StatusCode(), took)
	s.logRequest(ctx, r, id, pattern, err, took)
}

// routePool recycles the per-request route: nothing keeps one past its
// request (no goroutine or structure holds a *route).
var routePool = sync.Pool{New: func() any { return new(route) }}

// deadline is the request's context: Mq-Timeout-Ms or 10 s, plus the
// time a long-polling fetch may wait.
func deadline(ctx *fasthttp.RequestCtx) (context.Context, context.CancelFunc, error) {
	d := defaultTimeout
	v, ok, err := oneHeader(&ctx.Request.Header, "Mq-Timeout-Ms")
	if err != nil {
		return nil, nil, err
	}
	if ok {
		ms, ok := parseDigits(v)
		if !ok || ms < 1 || ms > uint64(maxTimeout/time.Millisecond) {
			return nil, nil, fmt.Errorf("%w: Mq-Timeout-Ms must be an integer in [1, %d], digits only", ErrBadHeader, maxTimeout/time.Millisecond)
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
	lctx, lcancel := leaderWait(rctx, r)
	defer lcancel()
	var handoff time.Time // since when this request waits for a hand-off
	fallback := false     // a coalesced route forwarded as its HTTP request
	for {
		// A leader handing off (graceful stop) takes no new work: the
		// request waits for the new leader and is forwarded there.
		if s.node.IsLeader() && !s.node.HandingOff() {
			if !s.node.Serving() {
				// Newly elected: wait until it has applied the log before it.
				if err := pause(rctx, 5*time.Millisecond); err != nil {
					return fmt.Errorf("%w: the new leader is still applying the log", replica.ErrNotLeader)
				}
				continue
			}
			err := r.def.handler(ctx, r)
			if !errors.Is(err, replica.ErrNotLeader) {
				return err
			}
			ctx.Response.Reset()
		}
		if err := s.waitLeader(lctx, r); err != nil {
			return err
		}
		if s.node.IsLeader() { // elected meanwhile, or handing off
			if s.node.HandingOff() {
				// Stopping, and leadership came back (no other node would
				// keep it): do not hold the request past the stop.
				if handoff.IsZero() {
					handoff = time.Now()
				} else if time.Since(handoff) > maxHandOffWait {
					return fmt.Errorf("%w: this node is stopping and no other node takes the leadership", replica.ErrShutdown)
				}
			}
			if err := pause(rctx, 5*time.Millisecond); err != nil {
				return fmt.Errorf("%w: leadership is being handed off", replica.ErrNotLeader)
			}
			continue
		}
		if r.def.Coalesce && s.opts.CoalesceForward && !fallback {
			err := s.viaCoalesced(ctx, r)
			switch {
			case errors.Is(err, errCoalesceFallback):
				fallback = true // forwarded as HTTP below
			case errors.Is(err, errLeaderUnreachable):
				if pause(lctx, 50*time.Millisecond) != nil {
					return errorf(ErrUnavailable, "the leader does not answer (%v) and no other leader answered within the request's deadline", err)
				}
				continue
			case errors.Is(err, replica.ErrNotLeader):
				// Nothing was proposed: the next leader takes it.
				ctx.Response.Reset()
				if pause(lctx, 10*time.Millisecond) != nil {
					return err
				}
				continue
			default:
				return err
			}
		}
		if fa, ok := longPoll(ctx, r); ok {
			// A long-poll waits here and forwards only short fetches.
			err := s.pollViaLeader(ctx, r, fa)
			if !errors.Is(err, errNowLeader) {
				return err
			}
			continue // this node leads now: serve the rest of the wait here
		}
		err := s.forward(rctx, ctx)
		if !errors.Is(err, errLeaderUnreachable) && !errors.Is(err, errLeaderLost) {
			return err
		}
		// The request never reached the leader, or is a read: wait for it
		// to come back or for a new one, within the deadline.
		if pause(lctx, 50*time.Millisecond) != nil {
			if r.def.Stale {
				return s.noLeaderForRead()
			}
			return errorf(ErrUnavailable, "the leader does not answer (%v) and no other leader answered within the request's deadline", err)
		}
	}
}

// viaCoalesced runs a coalesced route's handler on this follower, its
// command sent to the leader with others (coalesce.go).
func (s *Server) viaCoalesced(ctx *fasthttp.RequestCtx, r *route) error {
	r.remote = true
	defer func() { r.remote = false }()
	return r.def.handler(ctx, r)
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
	return s.forwardBody(rctx, ctx, nil)
}

// forwardBody is forward with the request's body replaced by body, unless
// body is nil.
func (s *Server) forwardBody(rctx context.Context, ctx *fasthttp.RequestCtx, body []byte) error {
	hops, _ := strconv.Atoi(string(ctx.Request.Header.Peek(forwardHeader)))
	if hops >= maxForwardHops {
		ctx.Response.Header.Set(forwardLoopHeader, "1")
		return fmt.Errorf("%w: leadership is changing, retry", replica.ErrNotLeader)
	}
	_, addr, ok := s.node.Leader()
	if !ok {
		return fmt.Errorf("%w: leader address unknown", replica.ErrNotLeader)
	}
	s.metrics.countForward(forwardToLeader)
	return s.forwardTo(rctx, ctx, addr, hops, body)
}

// forwardTo proxies the request to the node at HTTP address addr, as hop
// hops+1, with its body replaced by body unless nil.
func (s *Server) forwardTo(rctx context.Context, ctx *fasthttp.RequestCtx, addr string, hops int, body []byte) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req) // which drops the raw body
	// The head is copied; the body is not (it can be 16 MiB): the forward
	// sends the client request's own buffer, which stays valid until this
	// handler returns.
	ctx.Request.Header.CopyTo(&req.Header)
	if body == nil {
		body = ctx.Request.Body()
	}
	req.SetBodyRaw(body)
	req.SetHost(addr)
	req.URI().SetScheme("http")
	req.Header.Set(forwardHeader, strconv.Itoa(hops+1))
	dl, _ := rctx.Deadline()
	resp := &ctx.Response
	if err := s.fwd.DoDeadline(req, resp, dl); err != nil {
		resp.Reset()
		return s.forwardFailed(ctx, addr, err)
	}
	if hops == 0 && len(resp.Header.Peek(forwardLoopHeader)) > 0 {
		resp.Reset()
		return fmt.Errorf("%w: %s", errForwardLoop, addr)
	}
	return nil
}

// errForwardLoop: a forward went round nodes whose views of the leader
// were out of date until maxForwardHops refused it, doing nothing; the
// node the request entered by waits and forwards it again, as when the
// leader could not be reached.
var errForwardLoop = fmt.Errorf("%w (forwarded %d times while leadership moved)", errLeaderUnreachable, maxForwardHops)

// isDialError reports whether a forward failed before the request reached
// the peer's HTTP server: the connection was not made, or its mutual-TLS
// handshake failed (this node did not trust the peer's certificate, or the
// peer refused this node's: it then reads nothing sent on the connection),
// as when a node was restarted with another CA's certificate while the
// others still name it a data group's leader.
func isDialError(err error) bool {
	var op *net.OpError
	var verify *tls.CertificateVerificationError
	var alert tls.AlertError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		(errors.As(err, &op) && op.Op == "dial") || errors.As(err, &verify) || errors.As(err, &alert)
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
