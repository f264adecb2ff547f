package test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
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
	ctx := ctxFor(t, 240*time.Second)
	const topic, group, lease = "upgrade", "g", 300000
	leader, followers := mustRoles(t, c)
	mustTopic(t, leader, topic, map[string]any{"partitions": 2, "ack_timeout_ms": lease})
	total := 0
	publish := func(via *tc.Node, k int) {
		t.Helper()
		var batch []map[string]any
		for range k {
			batch = append(batch, map[string]any{"value": fmt.Sprintf("up-%03d", total)})
			total++
		}
		rtPublishBatch(t, via, topic, batch)
	}
	acked := map[string]int{} // value -> acks answered ok
	ack := func(via *tc.Node, msgs []tc.Message, what string) {
		t.Helper()
		res, _, err := via.Ack(ctx, topic, group, rtReceipts(msgs))
		if err != nil || len(res) != len(msgs) {
			t.Fatalf("ack of %s via %s: %d results for %d receipts, %v", what, via, len(res), len(msgs), err)
		}
		for i, r := range res {
			if r.Status != "ok" {
				t.Fatalf("ack of %s via %s: %s answered %q, want ok", what, via, mustValue(msgs[i]), r.Status)
			}
			acked[string(mustValue(msgs[i]))]++
		}
	}
	inFlight := func(via *tc.Node) int64 {
		t.Helper()
		st, ok, err := rtStats(ctx, via, topic, group)
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
	format := func(n *tc.Node) int {
		t.Helper()
		st, err := waitNodeStatus(ctx, n, "an answer", func(nodeStatus) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		return st.StateFormat
	}

	// All old: leases granted by the old binary, half of them acked now.
	publish(leader, 100)
	publish(leader, 100)
	first := rtFetchN(t, leader, topic, group, 100, 10*time.Second, lease)
	ack(leader, first[:50], "leases of the old leader")
	heldOld := first[50:]

	// The followers first: both run this binary; the old leader stays.
	for _, f := range followers {
		upgrade(f)
	}
	if l := mustLeader(t, c); l != leader {
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
	newLeader := mustLeader(t, c)
	if newLeader == oldNode {
		t.Fatalf("the old binary %s leads again; want an upgraded node", oldNode)
	}
	// The new leader knows every member and what its binary reads, and
	// keeps format 1 because of the old one.
	if _, err := waitView(ctx, newLeader, "every member probed, the old one reading format 0", func(ci tc.ClusterInfo) bool {
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
		if f := format(n); f != 1 {
			t.Fatalf("%s: state_format %d with an older member in the cluster, want 1", n, f)
		}
	}
	// Leases granted by the new leader while the old member is there.
	heldNew := rtFetchN(t, newLeader, topic, group, 100, 10*time.Second, lease)

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
	if err := waitMetric(ctx, oldNode, "mqd_raft_snapshot_restores_total", func(v float64) bool { return v >= 1 }); err != nil {
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
	handOffTo(ctx, t, newLeader, oldNode, other, 15*time.Second)
	newLeader.Restart()
	if l := mustLeader(t, c); l != oldNode {
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
		if _, err := waitNodeStatus(ctx, n, fmt.Sprint("state_format ", fsm.StateFormat), func(st nodeStatus) bool { return st.StateFormat == fsm.StateFormat }); err != nil {
			t.Fatal(err)
		}
	}
	// Leases in the new format (range records), the rest consumed and acked.
	l := mustLeader(t, c)
	extra := rtFetchN(t, l, topic, group, 30, 10*time.Second, lease)
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
	st, _, err := rtStats(ctx, l, topic, group)
	if err != nil || st.Acked != int64(total) || st.InFlight != 0 || st.Backlog != 0 {
		t.Fatalf("stats at the end: %+v (%v); want acked %d, nothing in flight or waiting", st, err, total)
	}
}
