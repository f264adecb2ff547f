package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
)

// fsmLeader leads and applies each proposal to a real state machine, one
// log entry each.
type fsmLeader struct {
	leaderNode
	f     *fsm.FSM
	mu    sync.Mutex
	index uint64
}

func (n *fsmLeader) CheckDisk(int) error { return nil }

func (n *fsmLeader) ApplyBatched(_ context.Context, c *command.Command) (*fsm.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.index++
	res, _ := n.f.Apply(&raft.Log{Index: n.index, Term: 1, Type: raft.LogCommand, Data: c.Encode()}).(*fsm.Result)
	if res == nil {
		return nil, fmt.Errorf("apply %d: no result", n.index)
	}
	return res, res.Err
}

func (n *fsmLeader) ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error) {
	res, errs := make([]*fsm.Result, len(cs)), make([]error, len(cs))
	for i, c := range cs {
		res[i], errs[i] = n.ApplyBatched(ctxs[i], c)
	}
	return res, errs
}

// follower is a Node that follows the leader at addr.
type follower struct {
	leaderNode
	addr string
}

func (follower) ID() string                          { return "n2" }
func (follower) IsLeader() bool                      { return false }
func (f follower) Leader() (string, string, bool)    { return "n1", f.addr, true }
func (follower) WaitLeader(ctx context.Context) bool { return true }

// openTopicFSM is a state machine holding topic orders with 3 partitions.
func openTopicFSM(t testing.TB) *fsm.FSM {
	t.Helper()
	f, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	parts := uint32(3)
	put := &command.Command{Op: command.OpPutTopic, Now: 1, Topic: "orders", Patch: mlog.Patch{Partitions: &parts}}
	if r, _ := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: put.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
		t.Fatalf("apply: %+v", r)
	}
	return f
}

// coalescePair is a leader's server on 127.0.0.1 and a follower's server
// (in-process: handle is called directly) that forwards to it.
func coalescePair(t *testing.T, opts Options) (leader, fol *Server, lf *fsmLeader) {
	return coalescePairOn(t, opts, func(lf *fsmLeader) Node { return lf })
}

// coalescePairOn is coalescePair with the leader's node wrapped by node.
func coalescePairOn(t *testing.T, opts Options, node func(*fsmLeader) Node) (leader, fol *Server, lf *fsmLeader) {
	t.Helper()
	lf = &fsmLeader{f: openTopicFSM(t), index: 1}
	leader = newServer(node(lf), lf.f, slog.New(slog.DiscardHandler), opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- leader.Serve(ln) }()
	t.Cleanup(func() {
		_ = leader.Shutdown(context.Background())
		<-done
	})
	fol = newServer(follower{addr: ln.Addr().String()}, openTopicFSM(t), slog.New(slog.DiscardHandler), opts)
	return leader, fol, lf
}

func publishVia(s *Server, bearer, key string) (int, []byte) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/topics/orders/messages")
	if bearer != "" {
		ctx.Request.Header.Set("Authorization", bearer)
	}
	if key != "" {
		ctx.Request.Header.Set("Idempotency-Key", key)
	}
	ctx.Request.SetBody([]byte("v-" + key))
	s.handle(&ctx)
	return ctx.Response.StatusCode(), append([]byte(nil), ctx.Response.Body()...)
}

// Publishes through a follower reach the leader's state as commands in
// internal requests (none as its own HTTP request), each answered as the
// leader would: 201 with its place, 200 for a repeated key.
func TestCoalescedPublishThroughFollower(t *testing.T) {
	leader, fol, lf := coalescePair(t, Options{CoalesceForward: true})
	const n = 64
	var wg sync.WaitGroup
	answers := make([]publishAnswer, n)
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			code, body := publishVia(fol, "", fmt.Sprintf("k%d", i))
			if code != 201 || json.Unmarshal(body, &answers[i]) != nil {
				errs <- fmt.Sprintf("publish %d: %d %s", i, code, body)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	seen := map[[2]uint64]bool{}
	for _, a := range answers {
		k := [2]uint64{uint64(a.Partition), a.Offset}
		if seen[k] {
			t.Errorf("two publishes answered at partition %d offset %d", a.Partition, a.Offset)
		}
		seen[k] = true
	}
	if lf.index != 1+n {
		t.Errorf("leader applied %d publishes, want %d", lf.index-1, n)
	}
	cmds, reqs := counterValue(fol.metrics.fwdCommands), counterValue(fol.metrics.fwdRequests)
	if cmds != n || reqs < 1 || reqs > n {
		t.Errorf("follower sent %v commands in %v requests, want %d in 1..%d", cmds, reqs, n, n)
	}
	if got := counterValue(leader.metrics.requests.WithLabelValues(publishPattern, "201")); got != 0 {
		t.Errorf("leader answered %v publish HTTP requests, want 0 (all coalesced)", got)
	}
	t.Logf("%v commands in %v internal requests", cmds, reqs)

	code, body := publishVia(fol, "", "k3")
	var a publishAnswer
	if code != 200 || json.Unmarshal(body, &a) != nil || !a.Duplicate || a != (publishAnswer{Topic: "orders", Partition: answers[3].Partition, Offset: answers[3].Offset, Duplicate: true}) {
		t.Errorf("repeated key through the follower: %d %s, want 200 duplicate of %+v", code, body, answers[3])
	}
	// A producer sequence gap: the leader's refusal and its expected
	// sequence reach the client as from the leader itself.
	seq := func(n string) *fasthttp.RequestCtx {
		ctx := new(fasthttp.RequestCtx)
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/topics/orders/messages")
		ctx.Request.Header.Set("Mq-Producer-Id", "p1")
		ctx.Request.Header.Set("Mq-Producer-Seq", n)
		fol.handle(ctx)
		return ctx
	}
	if ctx := seq("5"); ctx.Response.StatusCode() != 201 {
		t.Fatalf("producer p1 seq 5: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	ctx := seq("9")
	var direct fasthttp.RequestCtx
	ctx.Request.CopyTo(&direct.Request)
	leader.handle(&direct)
	if ctx.Response.StatusCode() != direct.Response.StatusCode() || string(ctx.Response.Body()) != string(direct.Response.Body()) ||
		string(ctx.Response.Header.Peek("Mq-Expected-Seq")) != string(direct.Response.Header.Peek("Mq-Expected-Seq")) ||
		len(ctx.Response.Header.Peek("Mq-Expected-Seq")) == 0 {
		t.Errorf("sequence gap through the follower: %d %s (expected %q); from the leader: %d %s (expected %q)",
			ctx.Response.StatusCode(), ctx.Response.Body(), ctx.Response.Header.Peek("Mq-Expected-Seq"),
			direct.Response.StatusCode(), direct.Response.Body(), direct.Response.Header.Peek("Mq-Expected-Seq"))
	}
}

// gatedLeader holds every group of commands with a key starting "slow"
// until gate is closed.
// gatedPair is coalescePairOn with a leader that holds the commands it
// is to apply until release is called (at the latest at the test's
// cleanup, before the servers stop: they wait for their requests).
func gatedPair(t *testing.T) (leader, fol *Server, gl *gatedLeader, release func()) {
	t.Helper()
	leader, fol, _ = coalescePairOn(t, Options{CoalesceForward: true}, func(lf *fsmLeader) Node {
		gl = &gatedLeader{fsmLeader: lf, gate: make(chan struct{})}
		return gl
	})
	var open sync.Once
	release = func() { open.Do(func() { close(gl.gate) }) }
	t.Cleanup(release)
	return leader, fol, gl, release
}

type gatedLeader struct {
	*fsmLeader
	gate chan struct{}
	held atomic.Int32 // commands held now
}

func (n *gatedLeader) ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error) {
	n.hold(cs...)
	return n.fsmLeader.ApplyBatchedAll(ctxs, cs)
}

func (n *gatedLeader) ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	n.hold(c)
	return n.fsmLeader.ApplyBatched(ctx, c)
}

func (n *gatedLeader) hold(cs ...*command.Command) {
	for _, c := range cs {
		if strings.HasPrefix(c.Msgs[0].Msg.IdempotencyKey, "slow") {
			n.held.Add(int32(len(cs)))
			<-n.gate
			n.held.Add(-int32(len(cs)))
			return
		}
	}
}

// A follower does not hold a command back for the answers to earlier ones:
// with many commands waiting for their commit on the leader, the next one
// is sent and answered as soon as it commits.
func TestCoalescedCommandNotHeldBehindOthers(t *testing.T) {
	_, fol, gl, release := gatedPair(t)
	const slow = 8
	var wg sync.WaitGroup
	codes := make([]int, slow)
	for i := range slow {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i], _ = publishVia(fol, "", fmt.Sprintf("slow%d", i)) }()
		// One at a time, so that each is a group of its own on the leader.
		for deadline := time.Now().Add(5 * time.Second); gl.held.Load() < int32(i+1); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the leader holds %d slow commands, want %d", gl.held.Load(), i+1)
			}
		}
	}
	done := make(chan int, 1)
	go func() { code, _ := publishVia(fol, "", "fast"); done <- code }()
	select {
	case code := <-done:
		if code != 201 {
			t.Errorf("fast publish: %d, want 201", code)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("a publish waited behind %d others that wait for their commit", slow)
	}
	release()
	wg.Wait()
	for i, c := range codes {
		if c != 201 {
			t.Errorf("slow publish %d: %d, want 201", i, c)
		}
	}
}

// postFrames sends commands straight to a server's internal route, as a
// node that holds the cluster permission would.
func postFrames(t *testing.T, s *Server, bearer string, fs []*fwdCall) (int, []*fwdCall, []byte) {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI(forwardPattern)
	if bearer != "" {
		ctx.Request.Header.Set("Authorization", bearer)
	}
	ctx.Request.SetBody(encodeFrames(fs, time.Now()))
	s.handle(&ctx)
	if ctx.Response.StatusCode() == 200 {
		if err := decodeAnswers(ctx.Response.Body(), fs); err != nil {
			t.Fatalf("answers: %v", err)
		}
	}
	return ctx.Response.StatusCode(), fs, ctx.Response.Body()
}

func frameOf(c *command.Command, token string) *fwdCall {
	return &fwdCall{reqID: []byte("r1"), token: []byte(token), route: publishPattern, cmd: c.Encode(), deadline: time.Now().Add(5 * time.Second)}
}

func onePublishCmd(topic string, partition uint32) *command.Command {
	return &command.Command{Op: command.OpPublish, Now: nowMs(), Topic: topic,
		Msgs: []mlog.Placed{{Partition: partition, Msg: &mlog.Message{Value: []byte("x"), MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1}}}}
}

// The leader takes no node's word for a command: each one's token is
// authorized again for its topic, only publishes pass, a message placed
// for another configuration goes back to be forwarded as HTTP, and a body
// it cannot read is refused whole. None of these changes the state.
func TestForwardedCommandsCheckedOnLeader(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.json")
	node, err := auth.AddToken(path, "node", []string{"cluster"})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auth.AddToken(path, "pub", []string{"publish:orders"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := auth.AddToken(path, "other", []string{"publish:invoices"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	leader, _, lf := coalescePair(t, Options{Auth: st, CoalesceForward: true})

	if code, _, body := postFrames(t, leader, "Bearer "+pub, []*fwdCall{frameOf(onePublishCmd("orders", 0), pub)}); code != 403 {
		t.Errorf("internal route with a publish token: %d %s, want 403", code, body)
	}
	del := &command.Command{Op: command.OpDeleteTopic, Now: nowMs(), Topic: "orders"}
	code, fs, body := postFrames(t, leader, "Bearer "+node, []*fwdCall{
		frameOf(onePublishCmd("orders", 0), pub),   // allowed
		frameOf(onePublishCmd("orders", 0), other), // a token without publish:orders
		frameOf(onePublishCmd("orders", 0), "mqd_nope"),
		frameOf(del, pub),                        // not a publish
		frameOf(onePublishCmd("orders", 7), pub), // partition 7 of 3
	})
	if code != 200 {
		t.Fatalf("internal route with the node token: %d %s", code, body)
	}
	if fs[0].err != nil || len(fs[0].res.Published) != 1 {
		t.Errorf("allowed publish: %+v %v", fs[0].res, fs[0].err)
	}
	for i, want := range []apiError{{}, {403, "forbidden"}, {401, "unauthenticated"}, {400, "bad_request"}} {
		if i == 0 {
			continue
		}
		if got := classify(fs[i].err); fs[i].err == nil || got != want {
			t.Errorf("frame %d: %v (%+v), want %+v", i, fs[i].err, got, want)
		}
	}
	if fs[4].err != errCoalesceFallback {
		t.Errorf("frame placed on partition 7: %v, want the HTTP fallback", fs[4].err)
	}
	if lf.index != 2 {
		t.Errorf("leader applied %d commands, want the one allowed publish", lf.index-1)
	}
	for _, bad := range [][]byte{nil, {0x7f}, {forwardCodec, 1, 0xff}, append(encodeFrames([]*fwdCall{frameOf(onePublishCmd("orders", 0), pub)}, time.Now()), 0)} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(forwardPattern)
		ctx.Request.Header.Set("Authorization", "Bearer "+node)
		ctx.Request.SetBody(bad)
		leader.handle(&ctx)
		if ctx.Response.StatusCode() != 400 || !strings.Contains(string(ctx.Response.Body()), "bad_request") {
			t.Errorf("body %x: %d %s, want 400 bad_request", bad, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	if lf.index != 2 {
		t.Errorf("leader applied %d commands after refused bodies, want 1", lf.index-1)
	}
}

// A leader that does not take streams gets the HTTP request itself, and
// later ones too for a while: an older release without the internal
// route (404), or the release whose internal requests carried a batch in
// their body (400 for the stream request's empty body).
func TestCoalescedFallsBackToHTTP(t *testing.T) {
	for _, tc := range []struct {
		name   string
		route  func(table []Route, i int) []Route
		series [2]string // the stream request's route and status on the old leader
	}{
		{"no route", func(table []Route, i int) []Route { return append(table[:i], table[i+1:]...) }, [2]string{"unmatched", "404"}},
		{"batches only", func(table []Route, i int) []Route {
			table[i].handler = func(ctx *fasthttp.RequestCtx, _ *route) error {
				_, err := decodeFrames(ctx.PostBody())
				return err
			}
			return table
		}, [2]string{forwardPattern, "400"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lf := &fsmLeader{f: openTopicFSM(t), index: 1}
			old := newServer(lf, lf.f, slog.New(slog.DiscardHandler), Options{})
			table := old.routes()
			table = tc.route(table, slices.IndexFunc(table, func(r Route) bool { return r.Pattern == forwardPattern }))
			rt, err := newRouter(table)
			if err != nil {
				t.Fatal(err)
			}
			old.router = rt
			addr := serveOn(t, old)
			fol := newServer(follower{addr: addr}, openTopicFSM(t), slog.New(slog.DiscardHandler), Options{CoalesceForward: true})
			for i := 0; i < 3; i++ {
				if code, body := publishVia(fol, "", fmt.Sprintf("k%d", i)); code != 201 {
					t.Fatalf("publish %d through the follower: %d %s", i, code, body)
				}
			}
			if got := counterValue(old.metrics.requests.WithLabelValues(publishPattern, "201")); got != 3 {
				t.Errorf("old leader answered %v publish requests, want 3", got)
			}
			if got := counterValue(old.metrics.requests.WithLabelValues(tc.series[0], tc.series[1])); got != 1 {
				t.Errorf("follower asked the old leader for %v streams, want 1 (then HTTP for a while)", got)
			}
			if got := counterValue(fol.metrics.fwdCommands); got != 0 {
				t.Errorf("follower sent %v commands coalesced, want 0", got)
			}
			if lf.index != 4 {
				t.Errorf("leader applied %d, want 3", lf.index-1)
			}
		})
	}
}

// serveOn serves s on a port of 127.0.0.1 until the test ends; it answers
// the address.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Shutdown(context.Background())
		<-done
	})
	return ln.Addr().String()
}

// A leader that stops answers what it read from its streams before it
// closes them.
func TestStoppingLeaderAnswersItsStream(t *testing.T) {
	leader, fol, gl, release := gatedPair(t)
	got := make(chan int, 1)
	go func() { code, _ := publishVia(fol, "", "slow1"); got <- code }()
	for deadline := time.Now().Add(5 * time.Second); gl.held.Load() < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leader never read the command")
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- leader.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond) // the stop has begun: it waits for the answer
	release()
	if code := <-got; code != 201 {
		t.Errorf("publish read before the stop: %d, want 201", code)
	}
	if err := <-stopped; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
