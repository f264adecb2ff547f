package api

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// benchNode leads, and answers a proposal after encoding it (as the group
// commit does before it waits) with the next offset: the HTTP path is what
// the publish benchmark measures, not raft or bbolt (bench/ measures those).
type benchNode struct {
	leaderNode
	next atomic.Uint64
}

func (n *benchNode) CheckDisk(int) error { return nil }

func (n *benchNode) ApplyBatched(_ context.Context, c *command.Command) (*fsm.Result, error) {
	_ = c.Encode()
	res := &fsm.Result{Published: make([]fsm.Published, len(c.Msgs))}
	for i, m := range c.Msgs {
		res.Published[i] = fsm.Published{Partition: m.Partition, Offset: n.next.Add(1) - 1}
	}
	return res, nil
}

// newBenchServer is a server on a benchNode and a real state machine that
// holds topic "orders" (3 partitions).
func newBenchServer(tb testing.TB, opts Options) *Server {
	return newServer(&benchNode{}, openTopicFSM(tb), slog.New(slog.DiscardHandler), opts)
}

// BenchmarkPublishHandler is one publish (1 KiB, a unique Idempotency-Key,
// no request id: the node makes one) through Server.handle, in-process:
// routing, auth (auth=on: a bearer token with publish:orders), headers,
// request id, deadline, command, answer, metrics and the request log line
// (not written: info level), on one reused RequestCtx as fasthttp's server
// reuses it. The benchNode's proposal costs 3 allocations of the 11.
//
//	go test -run '^$' -bench PublishHandler -benchmem ./api/
func BenchmarkPublishHandler(b *testing.B) {
	for _, withAuth := range []bool{false, true} {
		b.Run(map[bool]string{false: "auth=off", true: "auth=on"}[withAuth], func(b *testing.B) {
			opts, bearer := benchAuth(b, withAuth)
			s := newBenchServer(b, opts)
			var ctx fasthttp.RequestCtx
			key := append(make([]byte, 0, 40), "0000000000000000-"...)
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI("/v1/topics/orders/messages")
			ctx.Request.Header.SetContentType("application/octet-stream")
			if bearer != "" {
				ctx.Request.Header.Set("Authorization", bearer)
			}
			ctx.Request.SetBody(make([]byte, 1024))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx.Request.Header.Del(RequestIDHeader)
				ctx.Request.Header.SetBytesV("Idempotency-Key", strconv.AppendInt(key[:17], int64(i), 10))
				ctx.Response.Reset()
				s.handle(&ctx)
				if ctx.Response.StatusCode() != 201 {
					b.Fatalf("publish: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
				}
			}
		})
	}
}

// BenchmarkPublishHTTP is BenchmarkPublishHandler through fasthttp's
// server and client over an in-memory connection: fasthttp's request
// parsing and answer writing too (and its client's, on the same CPU).
//
//	go test -run '^$' -bench PublishHTTP -benchmem ./api/
func BenchmarkPublishHTTP(b *testing.B) {
	s := newBenchServer(b, Options{})
	ln := fasthttputil.NewInmemoryListener()
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(ln) }()
	defer func() {
		_ = s.srv.Shutdown()
		<-done
	}()
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI("http://mqd/v1/topics/orders/messages")
	req.Header.SetContentType("application/octet-stream")
	req.SetBody(make([]byte, 1024))
	key := append(make([]byte, 0, 40), "0000000000000000-"...)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Header.SetBytesV("Idempotency-Key", strconv.AppendInt(key[:17], int64(i), 10))
		if err := c.Do(req, resp); err != nil || resp.StatusCode() != 201 {
			b.Fatalf("publish: %v %d %s", err, resp.StatusCode(), resp.Body())
		}
	}
}

// benchAuth is the options and Authorization header of a benchmark: none,
// or an auth file with one token allowed to publish to orders.
func benchAuth(tb testing.TB, on bool) (Options, string) {
	if !on {
		return Options{}, ""
	}
	path := filepath.Join(tb.TempDir(), "tokens.json")
	secret, err := auth.AddToken(path, "producer", []string{"publish:orders"})
	if err != nil {
		tb.Fatal(err)
	}
	st, err := auth.Load(path)
	if err != nil {
		tb.Fatal(err)
	}
	return Options{Auth: st}, "Bearer " + secret
}
