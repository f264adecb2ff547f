package api

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/tlsconf"
	"github.com/valyala/fasthttp"
)

// countingServer serves addr ("" for a free port; over mutual TLS when
// store is set) until stop, answering every request 200 and counting them.
func countingServer(t *testing.T, addr string, store *tlsconf.Store) (ln net.Listener, n *atomic.Int64, stop func()) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if store != nil {
		ln = store.Listener(ln, tls.RequireAndVerifyClientCert, 5*time.Second)
	}
	n = &atomic.Int64{}
	srv := &fasthttp.Server{CloseOnShutdown: true, Handler: func(ctx *fasthttp.RequestCtx) {
		n.Add(1)
		ctx.SetBodyString("ok")
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return ln, n, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
		_ = ln.Close()
		select {
		case <-done:
		case <-ctx.Done():
			t.Errorf("server on %s did not stop", ln.Addr())
		}
	}
}

// A forward after the peer restarted is sent on a new connection, once:
// the idle one the old process closed is found closed before anything is
// written on it, instead of the write being lost ("closed the connection
// before answering", which a client must treat as "may have taken
// effect"). Every request reaches a server exactly once.
func TestForwardAfterPeerRestart(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { testForwardAfterPeerRestart(t, nil) })
	ca := tc.NewCA(t, "ca")
	cert, key := ca.Issue("n1")
	store, err := tlsconf.Load(tlsconf.Files{Cert: cert, Key: key, CA: ca.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("tls", func(t *testing.T) { testForwardAfterPeerRestart(t, store) })
}

func testForwardAfterPeerRestart(t *testing.T, store *tlsconf.Store) {
	ln, first, stop := countingServer(t, "", store)
	addr := ln.Addr().String()
	c := newForwardClient(Limits{}.withDefaults(), store)
	var last time.Time // the deadline of the latest request
	post := func() error {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + "/v1/topics/t/messages")
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBodyString("payload")
		last = time.Now().Add(time.Second)
		return c.DoDeadline(req, resp, last)
	}
	for range 3 { // a pooled, reused connection
		if err := post(); err != nil {
			t.Fatal(err)
		}
	}
	stop() // closes the idle connection: the peer's process is gone
	// The read deadline the last request left on the connection passes,
	// as it has on a connection idle for longer than a request's timeout.
	time.Sleep(time.Until(last) + 10*time.Millisecond)
	_, second, stop2 := countingServer(t, addr, store)
	defer stop2()
	for i := range 3 {
		if err := post(); err != nil {
			t.Fatalf("POST %d after the peer restarted: %v", i+1, err)
		}
	}
	if first.Load() != 3 || second.Load() != 3 {
		t.Fatalf("requests received: %d before the restart, %d after; want 3 and 3", first.Load(), second.Load())
	}
}
