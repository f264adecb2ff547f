package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestDataGroups: with --data-groups, three topics on three nodes go to
// three data groups led by three different nodes (SPEC section 12); every
// node serves every topic; keys deduplicate per topic; the kill -9 of one
// group's leader loses no acknowledged publish of any topic; the node
// comes back with its groups; GET /v1/topics and /v1/cluster see them all.
func TestDataGroups(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	topics := []string{"dg-a", "dg-b", "dg-c"}
	for i, tp := range topics {
		tc.MustTopic(t, nodes[(i+1)%3], tp, map[string]any{"partitions": 2})
	}
	leaders := systest.WaitSpread(t, nodes[0], topics)

	ctx := tc.CtxFor(t, 90*time.Second)
	acked := map[string][]string{}
	publishAll := func(round string, via []*tc.Node) {
		for _, tp := range topics {
			for i, n := range via {
				v := fmt.Sprintf("%s-%s-%d", tp, round, i)
				pr, err := systest.PublishKeyedRetry(ctx, []*tc.Node{n}, tp, v)
				if err != nil {
					t.Fatalf("publish %s via %s: %v", v, n, err)
				}
				if pr.Topic != tp {
					t.Fatalf("publish to %s answered topic %q", tp, pr.Topic)
				}
				acked[tp] = append(acked[tp], v)
			}
		}
	}
	publishAll("first", nodes)

	// A key deduplicates within its topic, through any node.
	for i, n := range nodes {
		pr, _, err := n.Publish(ctx, topics[0], []byte("keyed"), map[string]string{"Idempotency-Key": "only-once"})
		if err != nil || pr.Duplicate != (i > 0) {
			t.Fatalf("keyed publish %d via %s: %+v %v, want duplicate=%v", i, n, pr, err, i > 0)
		}
	}
	acked[topics[0]] = append(acked[topics[0]], "keyed")

	// Kill -9 the leader of the first topic's group: its topics fail over,
	// the others' groups keep their leaders or elect new ones.
	victim := c.NodeByID(leaders[topics[0]])
	victim.Kill()
	var live []*tc.Node
	for _, n := range nodes {
		if n != victim {
			live = append(live, n)
		}
	}
	publishAll("after-kill", live)

	for _, tp := range topics {
		got, want := consumedAndAcked(ctx, t, live[0], tp, "workers", acked[tp])
		if !slices.Equal(got, want) {
			t.Fatalf("topic %s consumed %v, want every acknowledged publish once: %v", tp, got, want)
		}
	}

	// The killed node reopens its data groups from its data dir and
	// catches up: it answers every topic's stats itself (stale reads).
	victim.Restart()
	if err := victim.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		want := int64(len(acked[tp]))
		for {
			var st tc.TopicStats
			r, err := victim.Do(ctx, http.MethodGet, "/v1/topics/"+tp+"?stale=ok", nil, nil)
			if err == nil {
				err = r.JSON(&st)
			}
			if err == nil && st.NextOffsets() == want {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("restarted %s: topic %s stats %+v %v, want %d messages", victim, tp, st, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	r, err := victim.Do(ctx, http.MethodGet, "/v1/topics", nil, nil)
	var list struct {
		Topics []struct {
			Name string `json:"name"`
		} `json:"topics"`
	}
	if err == nil {
		err = r.JSON(&list)
	}
	if err != nil || len(list.Topics) != 3 {
		t.Fatalf("GET /v1/topics: %v %s", err, r.Body)
	}
	r, err = victim.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
	var ci struct {
		Groups []struct {
			ID      string   `json:"id"`
			Members []string `json:"members"`
			Topics  int      `json:"topics"`
		} `json:"groups"`
		Nodes []struct {
			ID         string `json:"id"`
			TopicsHeld int    `json:"topics_held"`
		} `json:"nodes"`
	}
	if err == nil {
		err = r.JSON(&ci)
	}
	if err != nil || len(ci.Groups) != 3 {
		t.Fatalf("GET /v1/cluster: %v, want 3 groups: %s", err, r.Body)
	}
	for _, n := range ci.Nodes {
		if n.TopicsHeld != 3 {
			t.Errorf("node %s holds %d topics, want 3", n.ID, n.TopicsHeld)
		}
	}
	// A backup holds every group (TestBackupDataGroups restores one).
	r, err = victim.Do(ctx, http.MethodGet, "/v1/cluster/backup", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK || r.Header.Get("Content-Type") != "application/x-tar" || r.Header.Get("Mq-Backup-Groups") != "4" {
		t.Fatalf("backup with data groups: %d %s %v, want 200 and an archive of 4 groups", r.Status, r.Header, r.Body[:min(len(r.Body), 200)])
	}
}

// TestDataGroupsFiveNodes: on five nodes each topic has three replicas, the
// five groups are led by five nodes, and a node that holds no replica of a
// topic forwards its requests to one that does. Such a node knows the
// group's leader as the group's members do, before and after the leader's
// kill -9, and forwards a publish straight to it (one hop). Before every
// node knew every group's leader, the nodes outside a group named none.
func TestDataGroupsFiveNodes(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 5, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	var topics []string
	for i := range 5 {
		tp := fmt.Sprintf("dg5-%d", i)
		topics = append(topics, tp)
		tc.MustTopic(t, nodes[i], tp, nil)
	}
	ctx := tc.CtxFor(t, 60*time.Second)
	for _, tp := range topics {
		_, _, reps, err := systest.TopicPlacement(ctx, nodes[0], tp)
		if err != nil || len(reps) != 3 {
			t.Fatalf("topic %s: replicas %v %v, want 3", tp, reps, err)
		}
		outside := 0
		for _, n := range nodes {
			if slices.Contains(reps, n.ID()) {
				continue
			}
			outside++
			v := tp + "-via-" + n.ID()
			if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{n}, tp, v); err != nil {
				t.Fatalf("publish to %s through %s, which holds no replica: %v", tp, n, err)
			}
			msgs, err := tc.Drain(ctx, n, tp, "g", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := systest.Values(t, msgs); len(got) != 1 || got[0] != v {
				t.Fatalf("fetch %s through %s: %v, want [%s]", tp, n, got, v)
			}
		}
		if outside != 2 {
			t.Fatalf("topic %s: %d nodes outside its replicas %v, want 2", tp, outside, reps)
		}
	}
	systest.WaitSpread(t, nodes[4], topics)

	// The topic config replicas (SPEC section 12): 1 and 5 replicas, read
	// at creation; anything but 1, 3 or 5 is a 400 that creates nothing.
	for _, want := range []int{1, 5} {
		tp := fmt.Sprintf("dg5-r%d", want)
		tc.MustTopic(t, nodes[1], tp, map[string]any{"replicas": want})
		_, _, reps, err := systest.TopicPlacement(ctx, nodes[0], tp)
		if err != nil || len(reps) != want {
			t.Fatalf("topic %s: replicas %v %v, want %d", tp, reps, err, want)
		}
		v := tp + "-msg"
		if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{nodes[3]}, tp, v); err != nil {
			t.Fatalf("publish to %s: %v", tp, err)
		}
		msgs, err := tc.Drain(ctx, nodes[2], tp, "g", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := systest.Values(t, msgs); len(got) != 1 || got[0] != v {
			t.Fatalf("fetch %s: %v, want [%s]", tp, got, v)
		}
	}
	r, err := nodes[2].Do(ctx, http.MethodPut, "/v1/topics/dg5-r2", map[string]any{"replicas": 2}, nil)
	if err == nil {
		err = r.Expect(http.StatusBadRequest)
	}
	if err != nil {
		t.Fatalf("replicas 2: %v, want 400", err)
	}
	if r, err := nodes[2].Do(ctx, http.MethodGet, "/v1/topics/dg5-r2", nil, nil); err != nil || r.Expect(http.StatusNotFound) != nil {
		t.Fatalf("a refused replicas created the topic: %v %v", r, err)
	}

	// A node outside a topic's group knows the group's leader as its
	// members do, and forwards straight to it (one hop), after the
	// leader's kill -9 too.
	tp := topics[0]
	g, _, reps, err := systest.TopicPlacement(ctx, nodes[0], tp)
	if err != nil || g == "" {
		t.Fatalf("topic %s: group %q %v", tp, g, err)
	}
	var members, outside []*tc.Node
	for _, n := range nodes {
		if slices.Contains(reps, n.ID()) {
			members = append(members, n)
		} else {
			outside = append(outside, n)
		}
	}
	lctx := tc.CtxFor(t, 90*time.Second)
	leader := waitLeaderKnown(lctx, t, g, tp, members, outside, "")
	oneHop(lctx, t, tp, outside[0], nodes, 3)
	c.NodeByID(leader).Kill()
	members = slices.DeleteFunc(members, func(n *tc.Node) bool { return n.ID() == leader })
	next := waitLeaderKnown(lctx, t, g, tp, members, outside, leader)
	t.Logf("group %s: leader %s killed, %s leads; the nodes outside it, %v, know it", g, leader, next, outside)
	oneHop(lctx, t, tp, outside[1], slices.DeleteFunc(slices.Clone(nodes), func(n *tc.Node) bool { return n.ID() == leader }), 3)
	chunkedPoll(lctx, t, tp, outside[1], members[0])
}

// chunkedPoll: a long-poll through via, a node outside tp's group, is
// forwarded as fetches of at most a second's wait (so it never holds a
// forwarding connection for its whole wait), and answers a message
// published through pub while it waits.
func chunkedPoll(ctx context.Context, t *testing.T, tp string, via, pub *tc.Node) {
	t.Helper()
	if _, err := tc.Drain(ctx, via, tp, "lp", time.Second); err != nil {
		t.Fatalf("drain %s/lp through %s: %v", tp, via, err)
	}
	forwards := func() float64 {
		c := forwardCounts(ctx, t, []*tc.Node{via})[via.ID()]
		return c["leader"] + c["member"]
	}
	before := forwards()
	type answer struct {
		msgs []tc.Message
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		msgs, _, err := via.Fetch(ctx, tp, "lp", tc.FetchRequest{Max: 1, WaitMs: 10000})
		done <- answer{msgs, err}
	}()
	// Two forwards mean the first fetch came back empty and the poll goes on.
	for forwards() < before+2 {
		select {
		case a := <-done:
			t.Fatalf("the long-poll through %s ended after %v forwards: %d messages, %v; want it to wait, forwarded in chunks", via, forwards()-before, len(a.msgs), a.err)
		case <-ctx.Done():
			t.Fatalf("a long-poll through %s, outside %s's group: %v forwards, want at least 2 (chunks of at most 1 s)", via, tp, forwards()-before)
		case <-time.After(100 * time.Millisecond):
		}
	}
	v := tp + "-during-poll"
	if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{pub}, tp, v); err != nil {
		t.Fatalf("publish %s through %s: %v", v, pub, err)
	}
	select {
	case a := <-done:
		if a.err != nil || len(a.msgs) != 1 || string(systest.MustValue(a.msgs[0])) != v {
			t.Fatalf("the long-poll through %s answered %d messages, %v; want [%s]", via, len(a.msgs), a.err, v)
		}
	case <-ctx.Done():
		t.Fatalf("the long-poll through %s did not answer the message published while it waited", via)
	}
}

// groupLeaderVia is data group g's leader as n reports it: in GET
// /v1/cluster's groups, and in topic tp's placement in n's own GET
// /v1/topics?stale=ok (two answers that must agree, "" when unknown).
func groupLeaderVia(ctx context.Context, n *tc.Node, g, tp string) (string, error) {
	r, err := n.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var ci struct {
		Groups []systest.ClusterDataGroup `json:"groups"`
	}
	if err == nil {
		err = r.JSON(&ci)
	}
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(ci.Groups, func(x systest.ClusterDataGroup) bool { return x.ID == g })
	if i < 0 {
		return "", fmt.Errorf("%s: GET /v1/cluster lists no group %s", n, g)
	}
	r, err = n.Do(ctx, http.MethodGet, "/v1/topics?stale=ok", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var list struct {
		Topics []struct {
			Name      string `json:"name"`
			Placement struct {
				Group  string `json:"group"`
				Leader string `json:"leader"`
			} `json:"placement"`
		} `json:"topics"`
	}
	if err == nil {
		err = r.JSON(&list)
	}
	if err != nil {
		return "", err
	}
	for _, t := range list.Topics {
		if t.Name == tp {
			if t.Placement.Group != g || t.Placement.Leader != ci.Groups[i].Leader {
				return "", fmt.Errorf("%s: topic %s placed in %s led by %q, GET /v1/cluster: group %s led by %q",
					n, tp, t.Placement.Group, t.Placement.Leader, g, ci.Groups[i].Leader)
			}
			return t.Placement.Leader, nil
		}
	}
	return "", fmt.Errorf("%s: GET /v1/topics lists no %s", n, tp)
}

// waitLeaderKnown waits (bounded by ctx) until every member of data group
// g names the same leader, not was, and every node outside the group names
// it too; it answers that leader.
func waitLeaderKnown(ctx context.Context, t *testing.T, g, tp string, members, outside []*tc.Node, was string) string {
	t.Helper()
	seen := map[string]string{} // each node's latest answer
	var errs []error
	for {
		if ctx.Err() != nil {
			t.Fatalf("data group %s (members %v): the nodes name the leaders %v (%v), want one leader (not %q) named by its members and the nodes outside it", g, members, seen, errs, was)
		}
		errs = nil
		leader := ""
		for _, n := range append(slices.Clone(members), outside...) {
			l, err := groupLeaderVia(ctx, n, g, tp)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			seen[n.ID()] = l
			if leader == "" && slices.Contains(members, n) {
				leader = l
			}
		}
		agreed := leader != "" && leader != was && len(errs) == 0
		for _, l := range seen {
			agreed = agreed && l == leader
		}
		if agreed {
			return leader
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forwardCounts is each node's mqd_forwarded_requests_total by target.
func forwardCounts(ctx context.Context, t *testing.T, nodes []*tc.Node) map[string]map[string]float64 {
	t.Helper()
	out := map[string]map[string]float64{}
	for _, n := range nodes {
		fams := systest.Scrape(ctx, t, n)
		out[n.ID()] = map[string]float64{}
		for _, to := range []string{"leader", "member"} {
			v, ok := systest.MetricValue(fams, "mqd_forwarded_requests_total", map[string]string{"to": to})
			if !ok {
				t.Fatalf("%s: /metrics lacks mqd_forwarded_requests_total{to=%q}", n, to)
			}
			out[n.ID()][to] = v
		}
	}
	return out
}

// oneHop publishes k messages to tp through via, a node outside its group:
// via forwards each to the group's leader, and no other node forwards
// anything (a member that is not the leader would forward it on).
func oneHop(ctx context.Context, t *testing.T, tp string, via *tc.Node, nodes []*tc.Node, k int) {
	t.Helper()
	before := forwardCounts(ctx, t, nodes)
	for i := range k {
		v := fmt.Sprintf("%s-one-hop-via-%s-%d", tp, via.ID(), i)
		if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{via}, tp, v); err != nil {
			t.Fatalf("publish %s through %s: %v", v, via, err)
		}
	}
	after := forwardCounts(ctx, t, nodes)
	for _, n := range nodes {
		d := map[string]float64{}
		for to, v := range after[n.ID()] {
			d[to] = v - before[n.ID()][to]
		}
		switch {
		case n == via && (d["leader"] < float64(k) || d["member"] != 0):
			t.Fatalf("%s forwarded %v for %d publishes, want each to the leader of %s's group and none to another member", n, d, k, tp)
		case n != via && (d["leader"] != 0 || d["member"] != 0):
			t.Fatalf("%s forwarded %v while %d publishes went through %s: want them served in one hop", n, d, k, via)
		}
	}
}

// TestDataGroupsProcess: a process call whose outputs go to a topic of
// another data group than its input's keeps exactly-once (SPEC section
// 10): the outputs are published first under keys derived from the
// input's position, then the input is acked. A call refused after the
// outputs went out (its receipt had gone stale) leaves them stored; the
// redelivery's call deduplicates onto them and acks, so the output topic
// holds each output once.
func TestDataGroupsProcess(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithFlags("--data-groups"))
	n := c.Node(0)
	tc.MustTopic(t, n, "pin", nil)
	tc.MustTopic(t, n, "pout", nil)
	ctx := tc.CtxFor(t, 60*time.Second)
	gin, _, _, err1 := systest.TopicPlacement(ctx, n, "pin")
	gout, _, _, err2 := systest.TopicPlacement(ctx, n, "pout")
	if err1 != nil || err2 != nil || gin == "" || gin == gout {
		t.Fatalf("pin in %q, pout in %q (%v %v): want two data groups", gin, gout, err1, err2)
	}
	tc.MustPublish(t, n, "pin", "order-1", nil)
	process := func(via *tc.Node, receipt string) (*tc.Response, systest.ProcessAnswer) {
		t.Helper()
		body := map[string]any{"ack": []string{receipt}, "publish": []map[string]any{
			{"topic": "pout", "value": "shipped-1"}, {"topic": "pin", "value": "audit-1", "idempotency_key": "audit-1"},
		}}
		r, err := via.Do(ctx, http.MethodPost, "/v1/topics/pin/groups/proc/process", body, nil)
		if err != nil {
			t.Fatal(err)
		}
		var a systest.ProcessAnswer
		if r.Status == http.StatusOK {
			if err := r.JSON(&a); err != nil {
				t.Fatal(err)
			}
		}
		return r, a
	}
	fetch := func(leaseMs int) tc.Message {
		t.Helper()
		for {
			msgs, _, err := c.Node(1).Fetch(ctx, "pin", "proc", tc.FetchRequest{Max: 1, WaitMs: 500, LeaseMs: leaseMs})
			if err == nil && len(msgs) == 1 {
				return msgs[0]
			}
			if ctx.Err() != nil {
				t.Fatalf("fetch pin/proc: %v %v", msgs, err)
			}
		}
	}
	first := fetch(500)
	second := fetch(30000) // the first lease expired: redelivered
	if first.Offset != second.Offset || first.Receipt == second.Receipt {
		t.Fatalf("redelivery %+v of %+v", second, first)
	}
	// The stale receipt's call is refused before its foreign output is
	// published (api/processacross.go, checkAcross): nothing stored,
	// nothing acked. (Before, pout kept the refused call's output.)
	if r, _ := process(c.Node(2), first.Receipt); r.Status != http.StatusConflict {
		t.Fatalf("process with a stale receipt: %d %s, want 409", r.Status, r.Body)
	}
	if n := systest.MessagesIn(ctx, t, c.Node(1), "pout"); n != 0 {
		t.Fatalf("pout holds %d messages after a refused call, want none", n)
	}
	r, a := process(c.Node(2), second.Receipt)
	if r.Status != http.StatusOK || a.Acked != 1 || len(a.Results) != 2 || a.Results[0].Topic != "pout" || a.Results[0].Duplicate {
		t.Fatalf("process of the redelivery: %d %s, want acked 1 and the pout output stored", r.Status, r.Body)
	}
	// A repeat of the call answers its kept outcome; the foreign output,
	// published again under its derived key, at the same placement as a
	// duplicate (docs/API.md).
	want := a.Results[0]
	want.Duplicate = true
	if r, a2 := process(c.Node(0), second.Receipt); r.Status != http.StatusOK || !a2.Duplicate || a2.Results[0] != want || a2.Results[1] != a.Results[1] {
		t.Fatalf("repeat: %d %s, want duplicate with the results %v (pout's a duplicate)", r.Status, r.Body, a.Results)
	}
	msgs, err := tc.Drain(ctx, c.Node(1), "pout", "check", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := systest.Values(t, msgs); len(got) != 1 || got[0] != "shipped-1" {
		t.Fatalf("pout holds %v, want [shipped-1] once", got)
	}
	if !strings.HasPrefix(msgs[0].IdempotencyKey, "mqd-process-") {
		t.Fatalf("the output's key %q, want one derived from the input (mqd-process-...)", msgs[0].IdempotencyKey)
	}
	// The input is acked: the group gets nothing more.
	if msgs, err := tc.Drain(ctx, c.Node(1), "pin", "proc", time.Second); err != nil || len(msgs) != 1 || systest.Values(t, msgs)[0] != "audit-1" {
		t.Fatalf("pin/proc after the process: %v %v, want only the audit output", systest.Values(t, msgs), err)
	}
}

// waitNoReplicas waits (bounded) until node n holds no data group's files:
// its moves are done and its replicas deleted.
func waitNoReplicas(ctx context.Context, t *testing.T, n *tc.Node) {
	t.Helper()
	for {
		ents, err := os.ReadDir(filepath.Join(n.DataDir(), "groups"))
		if err == nil && len(ents) == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s still holds data group replicas %v (%v)", n, ents, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDataGroupsMoves: a new node gets a share of the replicas by
// POST /v1/cluster/rebalance; POST /v1/cluster/nodes/{id}/drain moves every
// replica off a node by raft membership changes while publishers run; the
// drained node is then removed; every acknowledged publish is consumed
// once, through the nodes that hold the topics now (SPEC section 12).
func TestDataGroupsMoves(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithFlags("--data-groups"))
	ctx := tc.CtxFor(t, 150*time.Second)
	topics := []string{"mv-a", "mv-b", "mv-c"}
	for _, tp := range topics {
		tc.MustTopic(t, c.Node(0), tp, nil)
	}
	n4 := c.AddNode("n4")
	if err := n4.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := n4.Do(ctx, http.MethodPost, "/v1/cluster/rebalance", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatalf("rebalance: %v", err)
	}
	// The moves are committed on the metadata leader when it answers; n4
	// shows them once it has applied them (GET /v1/cluster reads its own
	// state), within 10 s.
	rbody := string(r.Body)
	wctx := tc.CtxFor(t, 10*time.Second)
	for {
		groups, err := systest.ClusterGroups(wctx, n4)
		held := 0
		for _, ms := range groups {
			if slices.Contains(ms, "n4") {
				held++
			}
		}
		if err == nil && held >= 2 {
			break
		}
		if wctx.Err() != nil {
			t.Fatalf("after the rebalance (%s) n4 is in %d groups (%v %v), want its share (2 of 3)", rbody, held, groups, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Publishers through n2..n4 while n1 is drained.
	var mu sync.Mutex
	acked := map[string][]string{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	pubs := []*tc.Node{c.Node(1), c.Node(2), n4}
	for i, tp := range topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				v := fmt.Sprintf("%s-%d", tp, k)
				if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{pubs[i]}, tp, v); err != nil {
					t.Errorf("publish %s: %v", v, err)
					return
				}
				mu.Lock()
				acked[tp] = append(acked[tp], v)
				mu.Unlock()
			}
		}()
	}
	r, err = c.Node(2).Do(ctx, http.MethodPost, "/v1/cluster/nodes/n1/drain", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatalf("drain n1: %v", err)
	}
	waitNoReplicas(ctx, t, c.Node(0))
	close(stop)
	wg.Wait()
	if groups, err := systest.ClusterGroups(ctx, n4); err != nil || slices.ContainsFunc(slices.Collect(maps.Values(groups)), func(ms []string) bool { return slices.Contains(ms, "n1") }) {
		t.Fatalf("after the drain: groups %v %v, want none on n1", groups, err)
	}
	r, err = n4.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/n1", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatalf("remove n1: %v", err)
	}
	c.Node(0).Kill()
	for _, tp := range topics {
		got, want := consumedAndAcked(ctx, t, n4, tp, "check", acked[tp])
		if len(want) == 0 || !slices.Equal(got, want) {
			t.Fatalf("topic %s: consumed %d, acknowledged %d: every acknowledged publish once is wanted", tp, len(got), len(want))
		}
		t.Logf("topic %s: %d publishes acknowledged during the drain, each consumed once", tp, len(want))
	}
}

// consumedAndAcked drains topic tp through n as consumer group grp and
// answers the values consumed (one per stored position) and the acked
// ones, both sorted.
func consumedAndAcked(ctx context.Context, t *testing.T, n *tc.Node, tp, grp string, acked []string) (got, want []string) {
	t.Helper()
	msgs, err := tc.Drain(ctx, n, tp, grp, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got = systest.Values(t, systest.DistinctByPosition(msgs))
	slices.Sort(got)
	want = slices.Clone(acked)
	slices.Sort(want)
	return got, want
}

// TestDataGroupsReplicaMovedOffWhileDown: a node that stops once it has
// applied a drain of itself, before the groups' leaders carried it out,
// comes back with a directory that no longer names it for those groups:
// it deletes their replicas' files (once the groups' members hold what it
// held) instead of keeping them for good; every acknowledged publish is
// still there, through it. (The chaos suite's kill-during-move found it.)
func TestDataGroupsReplicaMovedOffWhileDown(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 4, tc.WithFlags("--data-groups"))
	ctx := tc.CtxFor(t, 120*time.Second)
	topics := []string{"down-a", "down-b", "down-c"}
	acked := map[string][]string{}
	for _, tp := range topics {
		tc.MustTopic(t, c.Node(1), tp, nil)
		v := tp + "-before"
		if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{c.Node(1)}, tp, v); err != nil {
			t.Fatalf("publish %s: %v", v, err)
		}
		acked[tp] = append(acked[tp], v)
	}
	n1 := c.Node(0)
	if ents, err := os.ReadDir(filepath.Join(n1.DataDir(), "groups")); err != nil || len(ents) == 0 {
		t.Fatalf("n1 holds no data group before the drain: %v %v", ents, err)
	}
	r, err := c.Node(1).Do(ctx, http.MethodPost, "/v1/cluster/nodes/n1/drain", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatalf("drain n1: %v", err)
	}
	// n1 applies the new members, then stops before its replicas move.
	for {
		groups, err := systest.ClusterGroups(ctx, n1)
		if err == nil && !slices.ContainsFunc(slices.Collect(maps.Values(groups)), func(ms []string) bool { return slices.Contains(ms, "n1") }) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("n1 never applied its drain: %v %v", groups, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := n1.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		v := tp + "-after"
		if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{c.Node(2)}, tp, v); err != nil {
			t.Fatalf("publish %s: %v", v, err)
		}
		acked[tp] = append(acked[tp], v)
	}
	n1.Restart()
	if err := n1.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitNoReplicas(ctx, t, n1)
	for _, tp := range topics {
		got, want := consumedAndAcked(ctx, t, n1, tp, "check", acked[tp])
		if !slices.Equal(got, want) {
			t.Fatalf("topic %s consumed %v, want every acknowledged publish once: %v", tp, got, want)
		}
	}
}

// TestDataGroupsMembersDown: a request about a topic reaching a node that
// holds no replica of its data group, while no member of the group
// answers, is a 503 (retry), not a 500: reads and writes alike.
func TestDataGroupsMembersDown(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 4, tc.WithFlags("--data-groups"))
	ctx := tc.CtxFor(t, 60*time.Second)
	tc.MustTopic(t, c.Node(0), "far", nil)
	_, _, reps, err := systest.TopicPlacement(ctx, c.Node(0), "far")
	if err != nil || len(reps) != 3 {
		t.Fatalf("placement of far: %v %v, want 3 replicas", reps, err)
	}
	var outside *tc.Node
	for _, n := range c.Nodes() {
		if slices.Contains(reps, n.ID()) {
			n.Kill()
		} else {
			outside = n
		}
	}
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/v1/topics/far"},
		{http.MethodGet, "/v1/topics/far/groups/g/dlq"},
		{http.MethodPost, "/v1/topics/far/messages"},
	} {
		r, err := outside.Do(ctx, req.method, req.path, []byte("x"), map[string]string{"Mq-Timeout-Ms": "2000"})
		if err != nil {
			t.Fatalf("%s %s via %s: %v", req.method, req.path, outside, err)
		}
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("%s %s via %s with every member of the topic's group down: %d %s, want 503", req.method, req.path, outside, r.Status, r.Body)
		}
	}
}
