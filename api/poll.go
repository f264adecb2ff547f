package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mqd/mqd/fsm"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// Errors of parked long-polls.
var (
	// ErrClientGone: the client closed its connection while its fetch waited.
	ErrClientGone = errors.New("client closed the connection")
	// errNowLeader: a follower's long-poll found this node leading.
	errNowLeader = errors.New("this node leads now")
)

func newPollGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "mqd_fetch_waiting",
		Help: "Long-polling fetches parked on this node (as leader, or as a follower waiting locally)."})
}

// park waits until woken, the next recheck, end, or shutdown (then stop
// is set: answer now). It answers ErrClientGone when the client has closed
// its connection meanwhile, so that a poll nobody waits for is released.
func (s *Server) park(ctx *fasthttp.RequestCtx, woken <-chan struct{}, end time.Time) (stop bool, err error) {
	if clientGone(ctx.Conn()) {
		return true, fmt.Errorf("%w: fetch abandoned", ErrClientGone)
	}
	t := time.NewTimer(max(0, min(time.Until(end), recheckEvery)))
	defer t.Stop()
	select {
	case <-woken:
	case <-t.C:
	case <-s.waiters.closed:
		return true, nil
	}
	return false, nil
}

// longPoll reports whether the request is a fetch that may wait, with
// its arguments.
func longPoll(ctx *fasthttp.RequestCtx, r *route) (fetchArgs, bool) {
	if !strings.HasSuffix(r.def.Pattern, "/fetch") {
		return fetchArgs{}, false
	}
	fa, err := parseFetch(ctx.PostBody())
	return fa, err == nil && fa.waitMs > 0
}

// pollViaLeader serves a long-polling fetch on a follower without holding
// a forwarding connection while it waits: the follower's own state machine
// applies the same log, so it waits here for its FSM to show something
// the group may lease (woken by the FSM's apply notification, rechecked
// for due times), and only then forwards a fetch that does not wait. Those
// short fetches use at most half the forwarding pool, which keeps the rest
// for writes. A fetch that comes back empty (another consumer was first)
// waits again. It answers errNowLeader, with the body's wait_ms set to
// what remains, when this node becomes the leader.
func (s *Server) pollViaLeader(ctx *fasthttp.RequestCtx, r *route, fa fetchArgs) error {
	end := time.Now().Add(time.Duration(fa.waitMs) * time.Millisecond)
	short := fa.body(0)
	s.polls.Inc()
	defer s.polls.Dec()
	// After a short fetch came back empty, look again soon (doubling up
	// to recheckEvery): this node's state may have been a little behind
	// the leader's, and a message may come due in between.
	retry := time.Duration(0)
	for {
		woken := s.waiters.wait(r.topic)
		if s.node.IsLeader() {
			ctx.Request.SetBody(fa.body(time.Until(end)))
			return errNowLeader
		}
		may, due := s.mayLease(r)
		if may {
			done, err := s.shortFetch(ctx, r, short, end)
			if done || err != nil {
				return err
			}
			retry = min(max(2*retry, 20*time.Millisecond), recheckEvery)
			due = time.Now().Add(retry)
		} else {
			retry = 0
		}
		if !time.Now().Before(end) {
			writeJSON(ctx, 200, map[string]any{"messages": []fetchedMessage{}})
			return nil
		}
		until := end
		if !due.IsZero() && due.Before(until) {
			until = due
		}
		if stop, err := s.park(ctx, woken, until); err != nil {
			return err
		} else if stop {
			end = time.Now()
		}
	}
}

// memberPollChunk bounds the wait of each fetch a node forwards for a
// long-poll of a topic whose data group it holds no replica of.
const memberPollChunk = time.Second

// pollViaMember serves a long-polling fetch of a topic in data group id,
// of which this node holds no replica, so has no state to wait on: it
// forwards the poll (to the group's leader, else a member) as fetches of at
// most memberPollChunk of wait, each on one of the long-polls' forwarding
// slots (half the pool), until one answers messages, anything but 200, or
// the wait is over. A parked poll thus never holds a pooled connection for
// long, nor more than half of them: the rest stay for writes.
func (s *Server) pollViaMember(ctx *fasthttp.RequestCtx, gn groupedNode, id string, fa fetchArgs) error {
	rctx, cancel, err := deadline(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	end := time.Now().Add(time.Duration(fa.waitMs) * time.Millisecond)
	for {
		ctx.Request.SetBody(fa.body(min(time.Until(end), memberPollChunk)))
		select {
		case s.pollFwd <- struct{}{}:
		case <-rctx.Done():
			return fmt.Errorf("%w: no forwarding slot for the fetch within its deadline", ErrUnavailable)
		}
		err := s.toGroupMember(ctx, gn, id)
		<-s.pollFwd
		if err != nil || ctx.Response.StatusCode() != 200 || !time.Now().Before(end) {
			return err
		}
		var got struct {
			Messages []json.RawMessage `json:"messages"`
		}
		if json.Unmarshal(ctx.Response.Body(), &got) != nil || len(got.Messages) > 0 {
			return nil
		}
		if clientGone(ctx.Conn()) {
			return fmt.Errorf("%w: fetch abandoned", ErrClientGone)
		}
		ctx.Response.Reset()
	}
}

// mayLease reports whether this node's state says a fetch of the group
// would lease something (or create the group): when in doubt, yes. If not,
// due is when the group's next waiting message becomes due (zero: none).
func (s *Server) mayLease(r *route) (ok bool, due time.Time) {
	err := s.state.Read(func(rd *fsm.Reader) error {
		var err error
		ok, due, err = rd.LeaseOutlook(r.topic, r.group, nowMs())
		return err
	})
	if err != nil {
		return true, time.Time{} // the leader answers the error
	}
	return ok, due
}

// shortFetch forwards a fetch that does not wait. done reports that the
// response in ctx is the answer: messages, an error, or the end of the wait.
func (s *Server) shortFetch(ctx *fasthttp.RequestCtx, r *route, body []byte, end time.Time) (done bool, err error) {
	select {
	case s.pollFwd <- struct{}{}:
	case <-r.ctx.Done():
		return true, fmt.Errorf("%w: no forwarding slot for the fetch within its deadline", ErrUnavailable)
	}
	err = s.forwardBody(r.ctx, ctx, body)
	<-s.pollFwd
	if errors.Is(err, errLeaderUnreachable) {
		// Wait for the leader to come back, or for a new one.
		if perr := pause(r.ctx, 50*time.Millisecond); perr != nil {
			return true, errorf(ErrUnavailable, "the leader does not answer (%v) and no other leader answered within the fetch's deadline", err)
		}
		return false, nil
	}
	if err != nil {
		return true, err
	}
	if ctx.Response.StatusCode() != 200 || !time.Now().Before(end) {
		return true, nil
	}
	var got struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if json.Unmarshal(ctx.Response.Body(), &got) == nil && len(got.Messages) == 0 {
		ctx.Response.Reset()
		return false, nil
	}
	return true, nil
}
