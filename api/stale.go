package api

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// Reads without the leader (docs/API.md, "Reads without a leader").
const (
	// StaleHeader, on an answer served with ?stale=ok, is how old this
	// node's view may be: milliseconds since it last heard from a leader
	// (0 on the leader itself; since the node started when it never has).
	StaleHeader = "Mq-Stale-Ms"
	// AppliedHeader, on the same answers, is the raft index of the last
	// entry the answer includes.
	AppliedHeader = "Mq-Applied-Index"
	// readLeaderWait bounds how long a read, from its start, looks for a
	// leader that answers: longer than an election, shorter than a
	// write's deadline (a read has no commit to wait for, so a minority
	// side answers soon).
	readLeaderWait = 3 * time.Second
)

var started = time.Now()

// msgError is an error whose message is said as is, for people, while
// errors.Is still finds the sentinel that decides its status and code.
type msgError struct {
	msg string
	err error
}

func (e *msgError) Error() string { return e.msg }
func (e *msgError) Unwrap() error { return e.err }

func errorf(sentinel error, format string, a ...any) error {
	return &msgError{msg: fmt.Sprintf(format, a...), err: sentinel}
}

// staleAsked reports whether a read route's request says ?stale=ok; any
// other value of stale is a 400.
func staleAsked(ctx *fasthttp.RequestCtx, r *route) (bool, error) {
	if !r.def.Stale {
		return false, nil
	}
	v := ctx.QueryArgs().Peek("stale")
	switch string(v) {
	case "":
		if ctx.QueryArgs().Has("stale") {
			return false, fmt.Errorf("%w: stale takes the value ok (stale=ok)", ErrBadRequest)
		}
		return false, nil
	case "ok":
		return true, nil
	}
	return false, fmt.Errorf("%w: stale takes the value ok (stale=ok), not %q", ErrBadRequest, v)
}

// serveStale answers a read from this node's applied state, saying how
// stale it may be: no leader is asked, nothing waits.
func (s *Server) serveStale(ctx *fasthttp.RequestCtx, r *route) error {
	rctx, cancel, err := deadline(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	r.ctx = rctx
	applied := s.state.AppliedIndex()
	stale := s.staleMs()
	if err := r.def.handler(ctx, r); err != nil {
		return err
	}
	ctx.Response.Header.Set(StaleHeader, strconv.FormatInt(stale, 10))
	ctx.Response.Header.Set(AppliedHeader, strconv.FormatUint(applied, 10))
	return nil
}

// staleMs is how old this node's view may be, in milliseconds.
func (s *Server) staleMs() int64 {
	if s.node.Serving() {
		return 0
	}
	if ms := s.node.LastContactMs(); ms >= 0 {
		return ms
	}
	return time.Since(started).Milliseconds()
}

// leaderWait is the context a request waits for a leader in: the
// request's own, or for a read one that ends readLeaderWait after the
// read began (a read has no commit to wait for, so a minority side
// answers soon, however long it takes to notice the leader is gone).
func leaderWait(rctx context.Context, r *route) (context.Context, context.CancelFunc) {
	if !r.def.Stale {
		return rctx, func() {}
	}
	return context.WithTimeout(rctx, readLeaderWait)
}

// waitLeader waits for a known leader within lctx (leaderWait's). The
// error says which kind of request it was, and for a read, how to read
// this node's state instead.
func (s *Server) waitLeader(lctx context.Context, r *route) error {
	if s.node.WaitLeader(lctx) {
		return nil
	}
	if r.def.Stale {
		return s.noLeaderForRead()
	}
	return fmt.Errorf("%w: no leader elected within the request's deadline", replica.ErrNoQuorum)
}

func (s *Server) noLeaderForRead() error {
	return errorf(replica.ErrNotLeader, "no leader: node %s found no leader that answers within %v (a majority of the nodes may be down or cut off); "+
		"this read answers from the leader's committed state; add ?stale=ok to read this node's applied state "+
		"(index %d, last heard from a leader %s)", s.node.ID(), readLeaderWait, s.state.AppliedIndex(), s.lastHeard())
}

func (s *Server) lastHeard() string {
	ms := s.node.LastContactMs()
	if ms < 0 {
		return "never since it started"
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String() + " ago"
}

// forwardFailed is what a client hears when a forward to the leader got
// no answer; the library's own error goes to the log only. A read is
// retried by the caller (onLeader); a write may or may not have been
// applied, and the answer says so.
func (s *Server) forwardFailed(ctx *fasthttp.RequestCtx, addr string, err error) error {
	s.logger.Warn("forward to leader failed", "leader", addr, "method", string(ctx.Method()),
		"path", string(ctx.Path()), "err", err)
	if isDialError(err) {
		return fmt.Errorf("%w: %s", errLeaderUnreachable, addr)
	}
	if errors.Is(err, fasthttp.ErrNoFreeConns) {
		// Nothing was sent: every forwarding connection stayed busy.
		return errorf(ErrUnavailable, "every connection to the leader %s stayed busy within the request's deadline: nothing was sent; retry", addr)
	}
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return errorf(ErrUnavailable, "the leader %s did not answer within the request's deadline: "+
			"the request may or may not have taken effect; retry it (a publish with the same Idempotency-Key is stored once)", addr)
	}
	if string(ctx.Method()) == fasthttp.MethodGet {
		return fmt.Errorf("%w: %s: connection lost", errLeaderLost, addr)
	}
	return errorf(ErrUnavailable, "the leader %s closed the connection before answering (it may have stopped): "+
		"the request may or may not have taken effect; retry it (a publish with the same Idempotency-Key is stored once)", addr)
}

// errLeaderLost: a read's forward lost its connection; it is retried.
var errLeaderLost = errors.New("leader lost")
