package api

import (
	"errors"
	"net"
	"time"

	"github.com/mqd/mqd/tlsconf"
	"github.com/valyala/fasthttp"
)

// A forward reuses an idle keep-alive connection to the leader. When the
// leader's process stopped since (a restart, a rolling upgrade), that
// connection is closed at the other end, but the client learns it only by
// sending: the request goes nowhere and the answer is "closed the
// connection before answering", which for a write means "may or may not
// have taken effect". So before the first byte of a request on a reused
// connection, the forwarding client peeks at its socket (one non-blocking
// recv): a connection the peer closed, or one with bytes nobody asked for,
// is dropped and the request is sent again on another one. Nothing was
// written on the dropped one, so no state can have changed.

// errStaleConn: a pooled connection to a peer was closed by the peer
// while idle; nothing was sent on it.
var errStaleConn = errors.New("idle forwarding connection closed by the peer; nothing sent")

// newForwardClient is the client that forwards requests to other nodes
// (over mutual TLS when tlsStore is set).
func newForwardClient(l Limits, tlsStore *tlsconf.Store) *fasthttp.Client {
	dial := func(addr string, timeout time.Duration) (net.Conn, error) {
		if timeout > 0 {
			return fasthttp.DialTimeout(addr, timeout)
		}
		return fasthttp.Dial(addr)
	}
	if tlsStore != nil {
		// The request stays http://: the connection itself is mutual TLS,
		// made with the certificates current at each dial.
		dial = tlsStore.DialTimeout
	}
	c := &fasthttp.Client{
		// The leader routes the path as the client sent it (routes.go:
		// match); normalized here, "dlq/..%2F..%2F..%2Fx" would reach it
		// as another route than the one this node authorized.
		DisablePathNormalizing: true,
		MaxConnsPerHost:        l.ForwardConns,
		// A request that finds every forwarding connection busy queues for
		// one (within its deadline) rather than failing at once.
		MaxConnWaitTimeout: defaultTimeout,
		ReadTimeout:        maxWait + time.Minute,
		WriteTimeout:       30 * time.Second,
		// Below the leader's idle timeout, so that a forward never reuses
		// a connection the leader is closing.
		MaxIdleConnDuration: min(10*time.Second, l.IdleTimeout/2),
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			conn, err := dial(addr, timeout)
			if err != nil {
				return nil, err
			}
			return &reuseChecked{Conn: conn}, nil
		},
	}
	// Only a request never sent is sent again: a write may have taken
	// effect even when no answer came.
	c.RetryIfErr = func(_ *fasthttp.Request, _ int, err error) (bool, bool) {
		if errors.Is(err, errStaleConn) {
			// The peer restarted: its other idle connections are stale
			// too. The client cannot close one host's only: the idle
			// connections to every node go (a new dial each, no more).
			c.CloseIdleConnections()
			return false, true
		}
		return false, false
	}
	return c
}

// reuseChecked is a forwarding connection that checks, before the first
// write of each request after the first, that the peer has not closed it.
// A connection serves one request at a time (HTTP/1.1, no pipelining).
type reuseChecked struct {
	net.Conn
	answered bool // a response's bytes were read since the last request began
}

func (c *reuseChecked) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.answered = true
	}
	return n, err
}

func (c *reuseChecked) Write(p []byte) (int, error) {
	if c.answered {
		c.answered = false
		if peerClosed(c.Conn) {
			return 0, errStaleConn
		}
	}
	return c.Conn.Write(p)
}

// peerClosed reports whether the idle connection c has anything to read:
// the peer's FIN, a reset, or bytes an idle HTTP connection never gets (a
// TLS alert before a close); false when it cannot tell.
func peerClosed(c net.Conn) bool {
	p := peekSocket(c)
	return p == peekData || p == peekClosed || p == peekFailed
}
