package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// preFormatRelease is the last main before the replicated state had a
// format: its binary reads and writes format 1 only (one record per
// leased message) and knows nothing of range lease records.
const preFormatRelease = "efa6caf"

// A rolling upgrade from a real older binary (built from preFormatRelease)
// to this one, the way docs/operations.md tells operators to do it, with
// leases open across it. While one member still runs the older binary the
// state stays in format 1, so everything that member may read from a new
// node is written the old way: here a snapshot the new leader installs on
// it, after which the old binary leads and must still see the leases the
// new leader granted (were they range records, it would count them acked
// and never redeliver them). Once every member runs the new binary the
// format rises to this binary's (2 and up); leases from both binaries are then acked, and every
// message is consumed exactly once.
func TestRollingUpgradeFromOlderRelease(t *testing.T) {
	t.Parallel()
	old := tc.BuildAt(t, preFormatRelease)
	// Frequent snapshots and a short log: a member that misses a few dozen
	// entries is sent a snapshot.
	c := tc.Start(t, 3, tc.WithBinary(old), tc.WithSnapshot(64, time.Second, 16))
	ctx := tc.CtxFor(t, 240*time.Second)
	const topic, group, lease = "upgrade", "g", 300000
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2, "ack_timeout_ms": lease})
	total := 0
	publish := func(via *tc.Node, k int) {
		t.Helper()
		var batch []map[string]any
		for range k {
			batch = append(batch, map[string]any{"value": fmt.Sprintf("up-%03d", total)})
			total++
		}
		systest.RtPublishBatch(t, via, topic, batch)
	}
	acked := map[string]int{} // value -> acks answered ok
	ack := func(via *tc.Node, msgs []tc.Message, what string) {
		t.Helper()
		res, _, err := via.Ack(ctx, topic, group, systest.RtReceipts(msgs))
		if err != nil || len(res) != len(msgs) {
			t.Fatalf("ack of %s via %s: %d results for %d receipts, %v", what, via, len(res), len(msgs), err)
		}
		for i, r := range res {
			if r.Status != "ok" {
				t.Fatalf("ack of %s via %s: %s answered %q, want ok", what, via, systest.MustValue(msgs[i]), r.Status)
			}
			acked[string(systest.MustValue(msgs[i]))]++
		}
	}
	inFlight := func(via *tc.Node) int64 {
		t.Helper()
		st, ok, err := systest.RtStats(ctx, via, topic, group)
		if err != nil || !ok {
			t.Fatalf("stats of %s/%s via %s: found %v, %v", topic, group, via, ok, err)
		}
		return st.InFlight
	}
	upgrade := func(n *tc.Node) {
		t.Helper()
		if err := n.Stop(); err != nil {
			t.Fatalf("graceful stop of %s: %v", n, err)
		}
		n.SetBinary("") // this repository's binary
		n.Restart()
		if err := n.WaitReady(ctx); err != nil {
			t.Fatalf("%s after its upgrade: %v", n, err)
		}
	}

	// All old: leases granted by the old binary, half of them acked now.
	publish(leader, 100)
	publish(leader, 100)
	first := systest.RtFetchN(t, leader, topic, group, 100, 10*time.Second, lease)
	ack(leader, first[:50], "leases of the old leader")
	heldOld := first[50:]

	// The followers first: both run this binary; the old leader stays.
	for _, f := range followers {
		upgrade(f)
	}
	if l := tc.MustLeader(t, c); l != leader {
		t.Fatalf("leader %s after the followers' upgrade, want %s still", l, leader)
	}
	// Leadership to an upgraded node; the old node comes back on its old
	// binary, a follower now.
	if err := leader.Stop(); err != nil {
		t.Fatalf("graceful stop of the old leader %s: %v", leader, err)
	}
	oldNode := leader
	oldNode.Restart()
	if err := oldNode.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	newLeader := tc.MustLeader(t, c)
	if newLeader == oldNode {
		t.Fatalf("the old binary %s leads again; want an upgraded node", oldNode)
	}
	// The new leader knows every member and what its binary reads, and
	// keeps format 1 because of the old one.
	if _, err := tc.WaitView(ctx, newLeader, "every member probed, the old one reading format 0", func(ci tc.ClusterInfo) bool {
		seen := 0
		for _, x := range ci.Nodes {
			want := fsm.StateFormat
			if x.ID == oldNode.ID() {
				want = 0
			}
			if x.LastContactMs >= 0 && x.StateFormatMax == want {
				seen++
			}
		}
		return len(ci.Nodes) == 3 && seen == 3
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range followers {
		if f := mustStateFormat(ctx, t, n); f != 1 {
			t.Fatalf("%s: state_format %d with an older member in the cluster, want 1", n, f)
		}
	}
	// Leases granted by the new leader while the old member is there.
	heldNew := systest.RtFetchN(t, newLeader, topic, group, 100, 10*time.Second, lease)

	// The old member misses enough of the log to be sent a snapshot by
	// the new leader.
	oldNode.Kill()
	before, err := newLeader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One entry per publish, until the leader's snapshot (taken every
	// 64 entries, keeping 16) is past what the stopped member holds.
	// (--snapshot-interval 1s: checked about every second.)
	for i, deadline := 0, time.Now().Add(30*time.Second); ; i++ {
		ci, err := newLeader.Cluster(ctx)
		if err == nil && ci.LastSnapshotIndex > before.CommitIndex+20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot past index %d after %d publishes in 30 s: %+v (%v)", before.CommitIndex+20, i, ci, err)
		}
		publish(newLeader, 1)
		time.Sleep(10 * time.Millisecond)
	}
	for range 20 {
		publish(newLeader, 1) // entries after the snapshot, replicated after the install
	}
	oldNode.Restart()
	if err := systest.WaitMetric(ctx, oldNode, "mqd_raft_snapshot_restores_total", func(v float64) bool { return v >= 1 }); err != nil {
		t.Fatalf("the old member was not sent a snapshot: %v", err)
	}
	if err := oldNode.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// The old binary leads on the state from that snapshot: the leader
	// stops while the other upgraded node is paused, so it hands off to
	// the old one (as in TestClockSkewedNodeDoesNotLead).
	var other *tc.Node
	for _, f := range followers {
		if f != newLeader {
			other = f
		}
	}
	other.Pause()
	systest.HandOffTo(ctx, t, newLeader, oldNode, other, 15*time.Second)
	newLeader.Restart()
	if l := tc.MustLeader(t, c); l != oldNode {
		t.Fatalf("leader %s, want the old member %s", l, oldNode)
	}
	// It sees every open lease, the new leader's included, and takes the
	// acks of both binaries' receipts.
	if got, want := inFlight(oldNode), int64(len(heldOld)+len(heldNew)); got != want {
		t.Fatalf("the old binary, leading on the new leader's snapshot, counts %d leases in flight, want %d", got, want)
	}
	ack(oldNode, heldOld, "leases of the old leader, acked via the old binary")
	ack(oldNode, heldNew, "leases of the new leader, acked via the old binary")

	// The last member upgraded: the format rises to this binary's everywhere.
	upgrade(oldNode)
	for _, n := range c.Nodes() {
		if _, err := systest.WaitNodeStatus(ctx, n, fmt.Sprint("state_format ", fsm.StateFormat), func(st systest.NodeStatus) bool { return st.StateFormat == fsm.StateFormat }); err != nil {
			t.Fatal(err)
		}
	}
	// Leases in the new format (range records), the rest consumed and acked.
	l := tc.MustLeader(t, c)
	extra := systest.RtFetchN(t, l, topic, group, 30, 10*time.Second, lease)
	publish(l, 50)
	ack(l, extra, "leases in the new format")
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msgs, _, err := l.Fetch(rctx, topic, group, tc.FetchRequest{Max: 100, WaitMs: 200, LeaseMs: lease})
		cancel()
		if err != nil {
			t.Fatalf("fetch via %s: %v", l, err)
		}
		if len(msgs) == 0 {
			break
		}
		ack(l, msgs, "the rest")
	}
	var missing, twice []string
	for i := range total {
		switch v := fmt.Sprintf("up-%03d", i); acked[v] {
		case 0:
			missing = append(missing, v)
		case 1:
		default:
			twice = append(twice, v)
		}
	}
	if len(missing) > 0 || len(twice) > 0 {
		t.Fatalf("of %d messages, never acked: %v; acked more than once: %v", total, missing, twice)
	}
	for _, n := range c.Nodes() {
		r, err := n.Do(ctx, http.MethodGet, "/readyz", nil, nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("%s not ready at the end: %v %v", n, r, err)
		}
	}
	st, _, err := systest.RtStats(ctx, l, topic, group)
	if err != nil || st.Acked != int64(total) || st.InFlight != 0 || st.Backlog != 0 {
		t.Fatalf("stats at the end: %+v (%v); want acked %d, nothing in flight or waiting", st, err, total)
	}
}

// previousRelease is release v0.2.0 (docs/releases/v0.2.0.md), the last
// before data groups: it reads state formats up to 3 and knows one raft
// group.
const previousRelease = "97a38aa"

// A rolling upgrade from the previous release into data groups, with
// traffic running through it (issue 22 item 6), the way docs/operations.md
// tells operators: each node stopped gracefully, started on this binary
// with --data-groups, and ready before the next. While a member runs the
// old binary the state format stays 3, whichever binary leads, and a topic
// created meanwhile goes to the default group as the old release would put
// it (at once, also while that member is down for its upgrade), never
// answered 503. Once the last member runs this binary the
// format rises to 4: topics made before keep their place in the default
// group and every promise (a key published before the upgrade is a
// duplicate after it, leases the old binary granted are acked), and new
// topics go to data groups led by different nodes. Every acknowledged
// publish is consumed and acked exactly once, and replicas agree.
func TestRollingUpgradeIntoDataGroups(t *testing.T) {
	t.Parallel()
	old := tc.BuildAt(t, previousRelease)
	c := tc.Start(t, 3, tc.WithBinary(old))
	ctx := tc.CtxFor(t, 170*time.Second)
	nodes := c.Nodes()
	leader, followers := tc.MustRoles(t, c)
	u := &rollUpgrade{t: t, ctx: ctx, nodes: nodes, heldAcks: map[string]int{}}
	// All on the previous release, in its newest format: a topic with
	// leases the old binary grants (half acked by it), and traffic.
	u.formatIs(3, "the previous release")
	tc.MustTopic(t, leader, "pre", map[string]any{"partitions": 2})
	tc.MustTopic(t, leader, "pre-held", map[string]any{"partitions": 2, "ack_timeout_ms": 300000})
	var heldValues []string
	var batch []map[string]any
	for i := range 40 {
		v := fmt.Sprintf("held-%02d", i)
		heldValues = append(heldValues, v)
		batch = append(batch, map[string]any{"value": v, "idempotency_key": v})
	}
	systest.RtPublishBatch(t, leader, "pre-held", batch)
	held := systest.RtFetchN(t, followers[0], "pre-held", "held", 20, 10*time.Second, 300000)
	u.ackHeld(followers[1], held[:10], "leases of the old binary, by it")
	heldOld := held[10:]

	tr := systest.StartRollTraffic(ctx, t, nodes, "pre")
	tr.WaitProgress("on the previous release", 20, "pre")
	preKeys := tr.SomeResults("pre", 6) // published before any upgrade

	// The followers first. With an old leader the state stays in format
	// 3, and a topic created through an upgraded node is the old leader's
	// to create: in the default group.
	u.upgrade(followers[0])
	tr.WaitProgress("after the first upgrade", 10, "pre")
	u.stillOld("one member upgraded")
	u.create(followers[0], "mid-a")
	u.inDefault(followers[0], "mid-a")
	tr.Add("mid-a")

	// An upgraded node leads while both other members run the old
	// binary (the old leader hands off to it while the other is paused,
	// then comes back on its old binary): it keeps format 3, and the
	// topic it creates goes to the default group at once.
	newLeader := followers[0]
	followers[1].Pause()
	systest.HandOffTo(ctx, t, leader, newLeader, followers[1], 15*time.Second)
	leader.Restart()
	if err := leader.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if l := tc.MustLeader(t, c); l != newLeader {
		t.Fatalf("leader %s, want the upgraded %s", l, newLeader)
	}
	if _, err := tc.WaitView(ctx, newLeader, "every member probed, the old ones reading format 3", func(ci tc.ClusterInfo) bool {
		seen := 0
		for _, x := range ci.Nodes {
			want := 3
			if x.ID == newLeader.ID() {
				want = fsm.StateFormat
			}
			if x.LastContactMs >= 0 && x.StateFormatMax == want {
				seen++
			}
		}
		return len(ci.Nodes) == 3 && seen == 3
	}); err != nil {
		t.Fatal(err)
	}
	u.createAtOnce(followers[1], "mid-b")
	u.inDefault(newLeader, "mid-b")
	tr.Add("mid-b")
	tr.WaitProgress("with an upgraded leader", 10, "pre", "mid-a", "mid-b")
	u.stillOld("an upgraded leader, two old members")

	// The other two, one by one. While the last old member is down for
	// its upgrade, a new topic still goes to the default group at once
	// (the leader last heard it reads format 3).
	u.upgrade(followers[1])
	tr.WaitProgress("after the second upgrade", 10, "pre", "mid-b")
	u.stillOld("two members upgraded")
	u.stop(leader)
	u.createAtOnce(followers[1], "mid-c")
	u.inDefault(newLeader, "mid-c")
	tr.Add("mid-c")
	u.startNew(leader)

	// Every member runs this binary: the format rises to 4 everywhere.
	// The topics made before stay in the default group; new ones go to
	// data groups led by three different nodes.
	u.formatIs(fsm.StateFormat, "every member upgraded")
	u.inDefault(nodes[2], "pre", "pre-held", "mid-a", "mid-b", "mid-c")
	post := []string{"post-a", "post-b", "post-c"}
	for i, tp := range post {
		u.create(nodes[i], tp)
	}
	systest.WaitSpread(t, nodes[0], post)
	tr.Add(post...)

	// A key published before the upgrade is a duplicate of its first
	// publish, through every node.
	for v, first := range preKeys {
		for _, n := range nodes {
			pr, _, err := n.Publish(ctx, "pre", []byte(v), map[string]string{"Idempotency-Key": v})
			if err != nil || !pr.Duplicate || pr.Partition != first.Partition || pr.Offset != first.Offset {
				t.Fatalf("key %s via %s after the upgrade: %+v %v, want a duplicate of %+v", v, n, pr, err, first)
			}
		}
	}
	// Leases the old binary granted are acked by the new one.
	u.ackHeld(nodes[1], heldOld, "leases of the old binary, by this one")
	tr.WaitProgress("after the upgrade", 20, append([]string{"pre", "mid-a", "mid-b", "mid-c"}, post...)...)
	tr.Finish()
	t.Logf("traffic: %s", tr.Summary())

	// Every acknowledged publish consumed and acked once; the old
	// binary's leases too; the replicas of every group agree.
	u.checkEnd(c, tr, heldValues)
}

// rollUpgrade is TestRollingUpgradeIntoDataGroups's cluster and the
// steps it takes on it.
type rollUpgrade struct {
	t        *testing.T
	ctx      context.Context
	nodes    []*tc.Node
	heldAcks map[string]int // value of pre-held → acks answered ok
}

// formatIs waits until every node answers state format want.
func (u *rollUpgrade) formatIs(want int, when string) {
	u.t.Helper()
	for _, n := range u.nodes {
		if _, err := systest.WaitNodeStatus(u.ctx, n, fmt.Sprint("state_format ", want), func(st systest.NodeStatus) bool { return st.StateFormat == want }); err != nil {
			u.t.Fatalf("%s: %v", when, err)
		}
	}
}

// stillOld checks that every node answers state format 3.
func (u *rollUpgrade) stillOld(when string) {
	u.t.Helper()
	for _, n := range u.nodes {
		if f := mustStateFormat(u.ctx, u.t, n); f != 3 {
			u.t.Fatalf("%s: %s has state_format %d with a member on the old binary, want 3", when, n, f)
		}
	}
}

func (u *rollUpgrade) stop(n *tc.Node) {
	u.t.Helper()
	if err := n.Stop(); err != nil {
		u.t.Fatalf("graceful stop of %s: %v", n, err)
	}
}

// startNew starts n on this repository's binary with --data-groups.
func (u *rollUpgrade) startNew(n *tc.Node) {
	u.t.Helper()
	n.SetBinary("") // this repository's binary
	n.SetArgs(append(n.Args(), "--data-groups"))
	n.Restart()
	if err := n.WaitReady(u.ctx); err != nil {
		u.t.Fatalf("%s after its upgrade: %v", n, err)
	}
}

func (u *rollUpgrade) upgrade(n *tc.Node) {
	u.t.Helper()
	u.stop(n)
	u.startNew(n)
}

// create creates a topic through via, again after no answer or a 503
// (a PUT may be repeated), but for 503 state_format_too_old (a rolling
// upgrade must not refuse creations) and for a forward whose
// connection was closed before the answer: no node stops while a
// topic is created here, so that is a forward sent on a pooled
// connection of a process that stopped since (api/fwdconn.go).
func (u *rollUpgrade) create(via *tc.Node, topic string) {
	u.t.Helper()
	for try := 0; ; try++ {
		rctx, cancel := context.WithTimeout(u.ctx, 10*time.Second)
		r, err := via.PutTopic(rctx, topic, map[string]any{"partitions": 2})
		cancel()
		var se *tc.StatusError
		switch {
		case err == nil && (r.Status == http.StatusCreated || try > 0 && r.Status == http.StatusOK):
			return
		case err == nil:
			u.t.Fatalf("create topic %s via %s: %d %s, want 201", topic, via, r.Status, r.Body)
		case errors.As(err, &se) && (se.Code == "state_format_too_old" || systest.RetryReason(err) == "503 unavailable (connection closed)"),
			!tc.Retryable(err), u.ctx.Err() != nil:
			u.t.Fatalf("create topic %s via %s: %v", topic, via, err)
		}
		u.t.Logf("create topic %s via %s: %v; again", topic, via, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// createAtOnce is create within 3 s: placement does not wait for a
// format that cannot come.
func (u *rollUpgrade) createAtOnce(via *tc.Node, topic string) {
	u.t.Helper()
	start := time.Now()
	u.create(via, topic)
	if d := time.Since(start); d >= 3*time.Second {
		u.t.Errorf("creating %s with an old member took %v: placement waited for a format that cannot come", topic, d)
	}
}

// inDefault checks that via places topics in the default group.
func (u *rollUpgrade) inDefault(via *tc.Node, topics ...string) {
	u.t.Helper()
	for _, tp := range topics {
		if g, _, _, err := systest.TopicPlacement(u.ctx, via, tp); err != nil || g != "" {
			u.t.Fatalf("topic %s via %s: group %q (%v), want the default group", tp, via, g, err)
		}
	}
}

// ackHeld acks msgs of pre-held's group "held" through via, each ok.
func (u *rollUpgrade) ackHeld(via *tc.Node, msgs []tc.Message, what string) {
	u.t.Helper()
	for len(msgs) > 0 {
		k := min(len(msgs), 100)
		res, _, err := via.Ack(u.ctx, "pre-held", "held", systest.RtReceipts(msgs[:k]))
		if err != nil || len(res) != k {
			u.t.Fatalf("ack of %s via %s: %d results for %d receipts, %v", what, via, len(res), k, err)
		}
		for i, r := range res {
			if r.Status != "ok" {
				u.t.Fatalf("ack of %s via %s: %s answered %q, want ok", what, via, systest.MustValue(msgs[i]), r.Status)
			}
			u.heldAcks[string(systest.MustValue(msgs[i]))]++
		}
		msgs = msgs[k:]
	}
}

// checkEnd checks, once the traffic has finished, that every
// acknowledged publish was consumed and acked once, the old binary's
// leases of heldValues too, and that the replicas of every group agree.
func (u *rollUpgrade) checkEnd(c *tc.Cluster, tr *systest.RollTraffic, heldValues []string) {
	t, ctx, nodes := u.t, u.ctx, u.nodes
	t.Helper()
	tr.Check(ctx, nodes[0])
	rest, err := tc.Drain(ctx, nodes[2], "pre-held", "held", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range systest.Values(t, rest) {
		u.heldAcks[v]++
	}
	for _, v := range heldValues {
		if u.heldAcks[v] != 1 {
			t.Errorf("pre-held: %s acked %d times, want once", v, u.heldAcks[v])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	systest.CompareStates(t, c)
	groups, err := systest.ClusterGroups(ctx, nodes[0])
	if err != nil || len(groups) != 3 {
		t.Fatalf("data groups %v (%v), want 3", groups, err)
	}
	for id, members := range groups {
		var ns []*tc.Node
		for _, m := range members {
			ns = append(ns, c.NodeByID(m))
		}
		systest.CompareStateFiles(t, ns, filepath.Join("groups", id, "fsm.db"))
	}
}

// mustStateFormat is the state format n answers in its status.
func mustStateFormat(ctx context.Context, t *testing.T, n *tc.Node) int {
	t.Helper()
	st, err := systest.WaitNodeStatus(ctx, n, "an answer", func(systest.NodeStatus) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	return st.StateFormat
}
