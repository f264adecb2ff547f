package api

import (
	"context"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
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
	f, err := fsm.OpenFSM(filepath.Join(tb.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	parts := uint32(3)
	put := &command.Command{Op: command.OpPutTopic, Now: 1, Topic: "orders", Patch: mlog.Patch{Partitions: &parts}}
	if r, _ := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: put.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
		tb.Fatalf("apply: %+v", r)
	}
	return newServer(&benchNode{}, f, slog.New(slog.DiscardHandler), opts)
}

// BenchmarkPublishHandler is one publish (1 KiB, a unique Idempotency-Key,
// no request id: the node makes one) through Server.handle, in-process:
// routing, headers, request id, deadline, command, answer, metrics and the
// request log line, on one reused RequestCtx as fasthttp's server reuses it.
//
//	go test -run '^$' -bench PublishHandler -benchmem ./api/
func BenchmarkPublishHandler(b *testing.B) {
	s := newBenchServer(b, Options{})
	var ctx fasthttp.RequestCtx
	body := make([]byte, 1024)
	key := append(make([]byte, 0, 40), "0000000000000000-"...)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/topics/orders/messages")
	ctx.Request.Header.SetContentType("application/octet-stream")
	ctx.Request.SetBody(body)
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
}
