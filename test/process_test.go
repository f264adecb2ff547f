package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqd/mqd/client"
	"github.com/mqd/mqd/group"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

type processError struct {
	Error struct {
		Code     string             `json:"code"`
		Message  string             `json:"message"`
		Receipts []tc.ReceiptResult `json:"receipts"`
	} `json:"error"`
}

// doProcess posts a process call via n and answers the status and body.
func doProcess(ctx context.Context, t *testing.T, n *tc.Node, topic, group string, receipts []string, outputs []map[string]any) *tc.Response {
	t.Helper()
	if outputs == nil {
		outputs = []map[string]any{}
	}
	body := map[string]any{"ack": receipts, "publish": outputs}
	r, err := n.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/groups/"+group+"/process", body, nil)
	if err != nil {
		t.Fatalf("process via %s: %v", n, err)
	}
	return r
}

func mustProcess(ctx context.Context, t *testing.T, n *tc.Node, topic, group string, receipts []string, outputs []map[string]any) systest.ProcessAnswer {
	t.Helper()
	r := doProcess(ctx, t, n, topic, group, receipts, outputs)
	var a systest.ProcessAnswer
	if err := r.Expect(200); err != nil {
		t.Fatalf("process via %s: %v", n, err)
	}
	if err := r.JSON(&a); err != nil {
		t.Fatal(err)
	}
	return a
}

// refusedProcess expects a refusal with status and code.
func refusedProcess(ctx context.Context, t *testing.T, n *tc.Node, what string, status int, code string, receipts []string, outputs []map[string]any) processError {
	t.Helper()
	r := doProcess(ctx, t, n, "in", "g", receipts, outputs)
	var e processError
	if r.Status != status || r.JSON(&e) != nil || e.Error.Code != code {
		t.Fatalf("%s via %s: %d %s, want %d %s", what, n, r.Status, r.Body, status, code)
	}
	return e
}

// Through the real binary on three nodes, via followers: every refusal of
// process leaves the receipts unacked and publishes nothing; the call
// then succeeds once, and its repeat (a lost answer) is answered with the
// same results and duplicate true; a consumer whose lease expired and
// whose message another consumer processed is refused, and the other's
// outputs exist once. With data groups the input and output topics live
// in different raft groups (api/processacross.go): the same holds.
func TestProcessThroughCluster(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, processThroughCluster)
}

func processThroughCluster(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 3, opts...)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader, followers := tc.MustRoles(t, c)
	systest.WaitFormat3(ctx, t, c)
	tc.MustTopic(t, leader, "in", map[string]any{"partitions": 2})
	tc.MustTopic(t, leader, "out", nil)
	tc.MustTopic(t, leader, "audit", map[string]any{"max_message_bytes": 64})
	for i := 1; i <= 3; i++ {
		tc.MustPublish(t, leader, "in", fmt.Sprintf("order %d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("order-%d", i)})
	}
	f0, f1 := followers[0], followers[1]
	msgs := systest.RtFetchN(t, f0, "in", "g", 2, 20*time.Second, 60000)
	rs := systest.RtReceipts(msgs)
	outputs := []map[string]any{
		{"topic": "out", "value": "paid " + msgs[0].IdempotencyKey, "idempotency_key": "pay-" + msgs[0].IdempotencyKey},
		{"topic": "audit", "value": "seen"},
		{"topic": "out", "value": "paid " + msgs[1].IdempotencyKey, "idempotency_key": "pay-" + msgs[1].IdempotencyKey},
	}

	e := refusedProcess(ctx, t, f0, "an invalid receipt", 409, "stale_receipt", []string{rs[0], "not-a-receipt"}, outputs)
	if len(e.Error.Receipts) != 2 || e.Error.Receipts[0].Status != "ok" || e.Error.Receipts[1].Status != "invalid" ||
		!strings.Contains(e.Error.Message, "not-a-receipt") {
		t.Fatalf("invalid receipt's error: %+v", e.Error)
	}
	// A receipt of an earlier delivery of the message: well formed, stale.
	old, err := group.ParseReceipt(rs[1], "in", "g")
	if err != nil {
		t.Fatal(err)
	}
	old.Delivery--
	stale := old.Encode("in", "g")
	e = refusedProcess(ctx, t, f1, "a stale receipt", 409, "stale_receipt", []string{rs[0], stale}, outputs)
	if len(e.Error.Receipts) != 2 || e.Error.Receipts[1].Status != "stale" {
		t.Fatalf("stale receipt's error: %+v", e.Error)
	}
	refusedProcess(ctx, t, f0, "an unknown output topic", 404, "topic_not_found", rs,
		append(outputs[:1:1], map[string]any{"topic": "nope", "value": "x"}))
	refusedProcess(ctx, t, f1, "an oversized output", 413, "message_too_large", rs,
		append(outputs[:1:1], map[string]any{"topic": "audit", "value": strings.Repeat("x", 65)}))
	if r := doProcess(ctx, t, f0, "in", "nogroup", rs, outputs); r.Status != 409 || !strings.Contains(string(r.Body), `"status":"invalid"`) {
		t.Fatalf("receipts of a group that does not exist: %d %s, want 409 with invalid receipts", r.Status, r.Body)
	}
	if n := systest.MessagesIn(ctx, t, leader, "out") + systest.MessagesIn(ctx, t, leader, "audit"); n != 0 {
		t.Fatalf("%d messages published by refused calls", n)
	}

	first := mustProcess(ctx, t, f0, "in", "g", rs, outputs)
	if first.Acked != 2 || first.Duplicate || len(first.Results) != 3 || first.Results[1].Topic != "audit" ||
		first.Results[0].Duplicate || first.Results[2].Topic != "out" {
		t.Fatalf("process: %+v", first)
	}
	// The answer was lost: the same call again, via another node.
	again := mustProcess(ctx, t, f1, "in", "g", rs, outputs)
	across := systest.TopicGroup(t, leader, "in") != systest.TopicGroup(t, leader, "out")
	if !again.Duplicate || again.Acked != 2 || !reflect.DeepEqual(again.Results, repeatedResults(first.Results, across)) {
		t.Fatalf("repeat: %+v, want duplicate of %+v", again, first)
	}
	if n := systest.MessagesIn(ctx, t, leader, "out"); n != 2 {
		t.Fatalf("out holds %d messages after a call and its repeat, want 2", n)
	}

	// A's lease runs out; B gets the message and processes it; A's late
	// call is refused and B's repeat answered as before.
	a := systest.RtFetchN(t, f0, "in", "g", 1, 20*time.Second, 1000)
	var b []tc.Message
	for deadline := time.Now().Add(30 * time.Second); len(b) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the expired lease was not redelivered within 30s")
		}
		b, _, _ = f1.Fetch(ctx, "in", "g", tc.FetchRequest{Max: 1, WaitMs: 2000, LeaseMs: 60000})
	}
	if b[0].Offset != a[0].Offset || b[0].Partition != a[0].Partition {
		t.Fatalf("redelivered %d/%d, want %d/%d", b[0].Partition, b[0].Offset, a[0].Partition, a[0].Offset)
	}
	out3 := []map[string]any{{"topic": "out", "value": "paid 3", "idempotency_key": "pay-" + a[0].IdempotencyKey}}
	byB := mustProcess(ctx, t, f1, "in", "g", systest.RtReceipts(b), out3)
	refusedProcess(ctx, t, f0, "the first consumer's late call", 409, "stale_receipt", systest.RtReceipts(a), out3)
	if rep := mustProcess(ctx, t, leader, "in", "g", systest.RtReceipts(b), out3); !rep.Duplicate || !reflect.DeepEqual(rep.Results, repeatedResults(byB.Results, across)) {
		t.Fatalf("B's repeat: %+v, want duplicate of %+v", rep, byB)
	}
	if n := systest.MessagesIn(ctx, t, leader, "out"); n != 3 {
		t.Fatalf("out holds %d messages, want 3 (one per input)", n)
	}
	st, err := leader.Stats(ctx, "in")
	if err != nil {
		t.Fatal(err)
	}
	if g := st.Groups["g"]; g.Acked != 3 || g.InFlight != 0 {
		t.Fatalf("input group: %+v, want 3 acked and none in flight", g)
	}
}

// repeatedResults are a call's results as its repeat answers them. Across
// raft groups (every output of this test's calls in another group than
// the input's) a repeat publishes the outputs again and answers each at
// the same placement as a duplicate: the input's group keeps the outcome
// of its own outputs only (docs/API.md, Outputs in other data groups).
func repeatedResults(rs []tc.PublishResult, across bool) []tc.PublishResult {
	if !across {
		return rs
	}
	out := slices.Clone(rs)
	for i := range out {
		out[i].Duplicate = true
	}
	return out
}

// Permissions: consume: on the input and publish: on every output, with
// --auth-file, checked before anything else and through a follower; a
// refused call acks nothing.
func TestProcessPermissions(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, map[string][]string{
		"node": {"cluster"}, "ops": {"monitor", "admin:*"}, "feeder": {"publish:orders"},
		"worker": {"consume:orders", "publish:payments"}, "narrow": {"consume:orders"},
		"pubonly": {"publish:payments", "publish:audit"},
	})
	c := tc.StartAuth(t, 3, fx)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader, followers := tc.MustRoles(t, c)
	systest.WaitFormat3(ctx, t, c)
	for _, tp := range []string{"orders", "payments", "audit"} {
		tc.MustTopic(t, leader, tp, nil)
	}
	as := func(who string) *tc.Client { return tc.DefaultClient.WithToken(fx.Secrets[who]) }
	if r, err := as("feeder").Do(ctx, http.MethodPost, leader.URL()+"/v1/topics/orders/messages", "o1", nil); err != nil || r.Expect(201) != nil {
		t.Fatalf("publish: %v %v", err, r.Expect(201))
	}
	f := followers[0]
	var rs []string
	for deadline := time.Now().Add(20 * time.Second); len(rs) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("fetched nothing within 20s")
		}
		r, err := as("worker").Do(ctx, http.MethodPost, f.URL()+"/v1/topics/orders/groups/g/fetch", tc.FetchRequest{Max: 1, WaitMs: 1000, LeaseMs: 60000}, nil)
		if err != nil || r.Expect(200) != nil {
			t.Fatalf("fetch: %v %v", err, r.Expect(200))
		}
		var fr tc.FetchResult
		if err := r.JSON(&fr); err != nil {
			t.Fatal(err)
		}
		rs = systest.RtReceipts(fr.Messages)
	}
	both := []map[string]any{{"topic": "payments", "value": "p"}, {"topic": "audit", "value": "a"}}
	cases := []struct {
		who      string
		receipts []string
		outputs  []map[string]any
		want     int
	}{
		{"worker", rs, both, 403},                                // lacks publish:audit
		{"narrow", rs, both[:1], 403},                            // lacks publish:payments
		{"narrow", []string{"garbage"}, both[:1], 403},           // before the receipt is looked at
		{"pubonly", rs, both, 403},                               // lacks consume:orders
		{"worker", rs, []map[string]any{{"topic": "nope"}}, 403}, // an unknown topic it may not publish to: 403, not 404
	}
	for _, k := range cases {
		r, err := as(k.who).Do(ctx, http.MethodPost, f.URL()+"/v1/topics/orders/groups/g/process", map[string]any{"ack": k.receipts, "publish": k.outputs}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := r.CheckError(); r.Status != k.want || code != "forbidden" {
			t.Fatalf("%s via %s: %d %s, want %d forbidden", k.who, f, r.Status, r.Body, k.want)
		}
	}
	if n := systest.MessagesIn(ctx, t, leader, "payments") + systest.MessagesIn(ctx, t, leader, "audit"); n != 0 {
		t.Fatalf("%d messages published by refused calls", n)
	}
	r, err := as("worker").Do(ctx, http.MethodPost, f.URL()+"/v1/topics/orders/groups/g/process", map[string]any{"ack": rs, "publish": both[:1]}, nil)
	if err != nil || r.Expect(200) != nil {
		t.Fatalf("process with the permissions: %v %v", err, r.Expect(200))
	}
}

// The Go client's handler form of the consumer loop, against the real
// binary: each order yields its payment through one process call; a
// handler error nacks (the retry then yields the payment once); outputs
// to an unknown topic are refused whole, the message nacked, nothing
// published. Every order is acked once and every payment exists once.
func TestClientConsumeProcess(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := tc.CtxFor(t, 90*time.Second)
	n := c.Node(0)
	systest.WaitFormat3(ctx, t, c)
	tc.MustTopic(t, n, "orders", map[string]any{"backoff_base_ms": 50, "backoff_jitter_ms": 0})
	tc.MustTopic(t, n, "payments", nil)
	const orders = 6
	for i := range orders {
		tc.MustPublish(t, n, "orders", fmt.Sprintf("o%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("o%d", i)})
	}
	cl, err := client.New(client.Config{Servers: []string{n.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var reported []error
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- cl.ConsumeProcess(cctx, "orders", "pay", func(_ context.Context, m *client.Message) ([]client.Output, error) {
			mu.Lock()
			defer mu.Unlock()
			seen[m.IdempotencyKey]++
			switch {
			case m.IdempotencyKey == "o1" && seen["o1"] == 1:
				return nil, errors.New("first attempt fails")
			case m.IdempotencyKey == "o2" && seen["o2"] == 1:
				return []client.Output{{Topic: "nope", Value: []byte("x")}}, nil
			}
			return []client.Output{{Topic: "payments", Value: []byte("paid " + string(m.Value))}}, nil
		}, client.ConsumeOptions{Wait: time.Second, Lease: 10 * time.Second, Concurrency: 2, OnError: func(err error) {
			mu.Lock()
			reported = append(reported, err)
			mu.Unlock()
		}})
	}()
	if _, err := systest.PollStats(ctx, n, "orders", func(st tc.TopicStats) bool { return st.Groups["pay"].Acked == orders }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ConsumeProcess: %v", err)
	}
	if got := systest.MessagesIn(ctx, t, n, "payments"); got != orders {
		t.Fatalf("%d payments for %d orders", got, orders)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["o1"] != 2 || seen["o2"] != 2 || seen["o0"] != 1 {
		t.Fatalf("handler calls per order: %v (errors reported: %v)", seen, reported)
	}
	if len(reported) > 0 { // a settled message acked or nacked again would answer stale
		t.Fatalf("errors reported: %v", reported)
	}
}
