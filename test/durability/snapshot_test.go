package durability

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// With frequent snapshots and short trailing logs, a follower whose data dir
// is wiped rejoins, catches up (from a snapshot, since the leader's log no
// longer starts at 1) and then serves every message. Once per raft log
// store, so that both stay tested; and with data groups, where the topic's
// group (its own snapshots under groups/<id>/) is what the follower
// catches up.
func TestSnapshotWipedFollowerCatchesUp(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"wal", "bolt"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testSnapshotWipedFollowerCatchesUp(t, store)
		})
	}
	t.Run("data-group", func(t *testing.T) {
		t.Parallel()
		testSnapshotWipedFollowerCatchesUp(t, "wal", tc.WithDataGroups())
	})
}

func testSnapshotWipedFollowerCatchesUp(t *testing.T, store string, opts ...tc.Option) {
	c := tc.Start(t, 3, append(opts, tc.WithSnapshot(100, time.Second, 50), tc.WithFlags("--raft-log", store))...)
	leader, fs := tc.MustRoles(t, c)
	ctx := tc.CtxFor(t, 150*time.Second)
	const topic = "snap"
	const total = 600
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	g := systest.TopicGroup(t, leader, topic)
	if g != "default" { // the roles in the topic's group
		var f1, f2 *tc.Node
		leader, f1, f2 = systest.GroupRoles(t, c, topic)
		fs = []*tc.Node{f1, f2}
	}

	want := map[string]bool{}
	for i := range total {
		want[fmt.Sprintf("s-%04d", i)] = true
	}
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 8 {
				p := fmt.Sprintf("s-%04d", i)
				if _, _, err := leader.Publish(ctx, topic, []byte(p), nil); err != nil {
					errs <- fmt.Errorf("publish %s: %v", p, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every node takes a snapshot that covers most of the publishes (more
	// than 100 entries behind is over the threshold and must be snapshotted).
	leaderApplied := systest.GroupApplied(t, leader, g)
	wantSnap := leaderApplied - 100
	snapCtx := tc.CtxFor(t, 30*time.Second)
	for _, n := range c.Nodes() {
		for {
			idx := systest.GroupSnapshot(snapCtx, t, n, g)
			if idx > 0 && idx >= wantSnap {
				break
			}
			if snapCtx.Err() != nil {
				t.Fatalf("node %s: no snapshot of raft group %s at index >= %d within 30 s of %d publishes (applied index %d) with --snapshot-threshold 100 --snapshot-interval 1s: at %d",
					n, g, wantSnap, total, leaderApplied, idx)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	f := fs[0]
	f.Kill()
	f.Wipe()
	f.Restart()
	if err := f.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("wiped follower %s not ready: %v", f, err)
	}
	leaderApplied = systest.GroupApplied(t, leader, g)
	var fApplied float64
	var held bool
	catch := tc.CtxFor(t, 60*time.Second)
	for {
		fApplied, held = systest.GroupFigure(catch, t, f, "mqd_raft_applied_index", g)
		if held && uint64(fApplied) >= leaderApplied {
			break
		}
		if catch.Err() != nil {
			t.Fatalf("wiped follower %s: applied index %.0f of raft group %s (held %v) never reached the leader's %d", f, fApplied, g, held, leaderApplied)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fSnap := systest.GroupSnapshot(ctx, t, f, g)
	t.Logf("leader %s: applied %d, last snapshot %d; wiped follower %s: applied %.0f, last snapshot %d (raft group %s)",
		leader, leaderApplied, systest.GroupSnapshot(ctx, t, leader, g), f, fApplied, fSnap, g)
	if fSnap == 0 {
		t.Errorf("wiped follower %s caught up without a snapshot (last_snapshot_index 0): the leader served compacted log entries", f)
	}

	if s, err := f.Stats(ctx, topic); err != nil || s.Messages != total || s.NextOffsets() != total {
		t.Errorf("stats via wiped follower %s: messages %d, next offsets %d, err %v; want %d", f, s.Messages, s.NextOffsets(), err, total)
	}
	msgs, err := tc.Drain(ctx, f, topic, "after-wipe", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	systest.CheckExactly(t, "consumed via the wiped follower", systest.Values(t, systest.DistinctByPosition(msgs)), want)

	// The wiped node forwards writes and serves fresh reads.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tc.MustPublish(t, f, topic, "after catch-up", nil)
	got, _, err := f.Fetch(rctx, topic, "after-wipe", tc.FetchRequest{Max: 10, WaitMs: 3000})
	if err != nil || len(got) != 1 || systest.Values(t, got)[0] != "after catch-up" {
		t.Fatalf("fetch via wiped follower after a new publish: %d messages, %v", len(got), err)
	}
}

// Once the state is large (over 4 MiB), entries alone no longer trigger a
// snapshot (it copies the whole state): the log since the last one must
// also hold at least half the state's size. Small publishes past the entry threshold
// leave the snapshot where it is; as many bytes as half the state move it.
// With data groups the same holds for the topic's group.
func TestSnapshotWaitsForLogBytesWhenStateIsLarge(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, snapshotWaitsForLogBytes)
}

func snapshotWaitsForLogBytes(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 1, append(opts, tc.WithSnapshot(50, 200*time.Millisecond, 50))...)
	n := c.Nodes()[0]
	ctx := tc.CtxFor(t, 120*time.Second)
	const topic = "snap-bytes"
	tc.MustTopic(t, n, topic, nil)
	g := systest.TopicGroup(t, n, topic)
	// 7000 bytes: one message to an 8 KiB page (a value just over 8 KiB
	// would take two, and make the state twice the payload).
	const value = 7000
	publishMiB := func(mib int) {
		t.Helper()
		publishBatches(ctx, t, n, topic, mib*(1<<20)/(100*value), value)
	}
	// settled waits until the snapshot index has not moved for 1 s.
	settled := func() uint64 {
		t.Helper()
		last, since := uint64(0), time.Now()
		for time.Since(since) < time.Second {
			if idx := systest.GroupSnapshot(ctx, t, n, g); idx != last {
				last, since = idx, time.Now()
			}
			time.Sleep(100 * time.Millisecond)
		}
		return last
	}

	publishMiB(40) // the state passes 4 MiB early (snapshots by entries until then)
	s1 := settled()
	if s1 == 0 {
		t.Fatalf("no snapshot while publishing 40 MiB with --snapshot-threshold 50")
	}
	for i := range 200 { // 200 entries, a few KiB of log
		tc.MustPublish(t, n, topic, fmt.Sprintf("small %d", i), nil)
	}
	time.Sleep(1500 * time.Millisecond) // 7 checks
	if s2 := settled(); s2 != s1 {
		t.Fatalf("snapshot moved from %d to %d after 200 small publishes: with a 47 MiB state it should wait for 23 MiB of log", s1, s2)
	}
	// Log bytes move it: how many depends on where s1 fell (the log since
	// it holds up to half the state already), at most about 60 MiB more
	// at 1.17 bytes of state per payload byte. Publish in 8 MiB steps.
	for total := 8; ; total += 8 {
		publishMiB(8)
		deadline := time.Now().Add(time.Second) // five checks
		for {
			if idx := systest.GroupSnapshot(ctx, t, n, g); idx > s1 {
				t.Logf("snapshot moved from %d to %d after %d MiB more of log", s1, idx, total)
				return
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if total >= 120 {
			t.Fatalf("no snapshot after %d MiB more of log (40 MiB of payload before)", total)
		}
	}
}

// Log bytes alone trigger a snapshot: batch publishes are few, large raft
// entries, and counting entries (here --snapshot-threshold 1000000) would
// never snapshot, so the log, and what a restart reads back, would grow
// without bound.
// With data groups the same holds for the topic's group.
func TestSnapshotOnLogBytesBelowEntryThreshold(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, snapshotOnLogBytes)
}

func snapshotOnLogBytes(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 1, append(opts, tc.WithSnapshot(1000000, 200*time.Millisecond, 50))...)
	n := c.Nodes()[0]
	ctx := tc.CtxFor(t, 120*time.Second)
	const topic = "snap-large-entries"
	tc.MustTopic(t, n, topic, nil)
	g := systest.TopicGroup(t, n, topic)
	// 24 MiB in 30 entries of 800 KiB: the state passes 4 MiB after a few,
	// and the log then holds more than half of it.
	publishBatches(ctx, t, n, topic, 30, 8<<10)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if idx := systest.GroupSnapshot(ctx, t, n, g); idx > 0 {
			t.Logf("snapshot at index %d of %d", idx, systest.GroupApplied(t, n, g))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of raft group %s 20 s after 24 MiB of log in %d entries (--snapshot-threshold 1000000)", g, systest.GroupApplied(t, n, g))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// publishBatches publishes count batches of 100 messages of size bytes
// each (one raft entry per batch) to topic through n.
func publishBatches(ctx context.Context, t *testing.T, n *tc.Node, topic string, count, size int) {
	t.Helper()
	value := strings.Repeat("v", size)
	var batch strings.Builder
	batch.WriteString(`{"messages":[`)
	for i := range 100 {
		if i > 0 {
			batch.WriteByte(',')
		}
		batch.WriteString(`{"value":"` + value + `"}`)
	}
	batch.WriteString(`]}`)
	for range count {
		r, err := n.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/messages:batch", batch.String(), nil)
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err != nil {
			t.Fatalf("batch publish: %v", err)
		}
	}
}

// The log a node holds past its latest snapshot still counts toward the
// next one after a crash: raft replays it at start, and
// mqd_raft_log_bytes_since_snapshot shows it again. So a node that
// restarts more often than it writes half its state's size of log still
// snapshots (it used to start counting from zero, and its log to grow).
// With data groups the same holds for the topic's group.
func TestSnapshotLogBytesSurviveRestart(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, snapshotLogBytesSurviveRestart)
}

func snapshotLogBytesSurviveRestart(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 1, append(opts, tc.WithSnapshot(1000000, 200*time.Millisecond, 50))...)
	n := c.Nodes()[0]
	ctx := tc.CtxFor(t, 120*time.Second)
	const topic = "snap-restart"
	tc.MustTopic(t, n, topic, nil)
	g := systest.TopicGroup(t, n, topic)
	since := func() float64 {
		t.Helper()
		v, ok := systest.GroupFigure(ctx, t, n, "mqd_raft_log_bytes_since_snapshot", g)
		if !ok {
			t.Fatal("no mqd_raft_log_bytes_since_snapshot on /metrics")
		}
		return v
	}
	// 1.6 MiB of log in two entries: below the 2 MiB that makes a snapshot
	// of a state under 4 MiB due.
	publishBatches(ctx, t, n, topic, 2, 8<<10)
	before := since()
	if before < 1.5*(1<<20) {
		t.Fatalf("%.0f bytes since the snapshot after 1.6 MiB of batches", before)
	}
	n.Kill()
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	// raft starts at the state's applied index and does not read the log
	// before it; the node counts those bytes itself, just after start
	// (replica/startsnap.go).
	for after := since(); after < before; after = since() {
		if ctx.Err() != nil || time.Since(ready) > 10*time.Second {
			t.Fatalf("after a crash and restart: %.0f bytes since the snapshot, want at least the %.0f before", after, before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if idx := systest.GroupSnapshot(ctx, t, n, g); idx != 0 {
		t.Fatalf("a snapshot at %d before 2 MiB of log", idx)
	}
	// 0.8 MiB more: 2.4 MiB since the start, and a snapshot follows.
	publishBatches(ctx, t, n, topic, 1, 8<<10)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if systest.GroupSnapshot(ctx, t, n, g) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of raft group %s 20 s after 2.4 MiB of log across a restart (%.0f bytes since by the gauge)", g, since())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := since(); v >= 1<<20 {
		t.Fatalf("after the snapshot: %.0f bytes since it", v)
	}
}
