package api

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// leaderNode is a Node that leads and serves, for handlers run in-process
// on a real state machine; a method a handler should not need panics (the
// embedded nil interface).
type leaderNode struct{ Node }

func (leaderNode) ID() string                         { return "n1" }
func (leaderNode) IsLeader() bool                     { return true }
func (leaderNode) Serving() bool                      { return true }
func (leaderNode) HandingOff() bool                   { return false }
func (leaderNode) Collectors() []prometheus.Collector { return nil }
func (leaderNode) Leader() (string, string, bool)     { return "n1", "127.0.0.1:7070", true }
func (leaderNode) Servers() ([]raft.Server, error) {
	return []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: "127.0.0.1:7071"}}, nil
}

// A handler runs in-process on the interfaces alone (api.Node, api.State):
// here GET /v1/topics/{topic} reads a topic applied to a real fsm.FSM, and
// answers 404 for one that was not.
func TestHandlerInProcess(t *testing.T) {
	f, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	parts := uint32(3)
	put := &command.Command{Op: command.OpPutTopic, Now: 1, Topic: "orders", Patch: mlog.Patch{Partitions: &parts}}
	if r, _ := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: put.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
		t.Fatalf("apply: %+v", r)
	}
	s := newServer(leaderNode{}, f, slog.New(slog.DiscardHandler), Options{})
	get := func(path string) (int, map[string]any) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(path)
		s.handle(&ctx)
		var body map[string]any
		if err := json.Unmarshal(ctx.Response.Body(), &body); err != nil {
			t.Fatalf("GET %s: %d %q: %v", path, ctx.Response.StatusCode(), ctx.Response.Body(), err)
		}
		return ctx.Response.StatusCode(), body
	}
	if code, body := get("/v1/topics/orders"); code != 200 || body["name"] != "orders" || len(body["partitions"].([]any)) != 3 ||
		body["placement"] == nil {
		t.Errorf("GET /v1/topics/orders: %d %v; want 200, orders with 3 partitions and its placement", code, body)
	}
	if code, body := get("/v1/topics/missing"); code != 404 {
		t.Errorf("GET /v1/topics/missing: %d %v; want 404", code, body)
	}
}
