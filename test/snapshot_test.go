package test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// With frequent snapshots and short trailing logs, a follower whose data dir
// is wiped rejoins, catches up (from a snapshot, since the leader's log no
// longer starts at 1) and then serves every message.
func TestSnapshotWipedFollowerCatchesUp(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithSnapshot(100, time.Second, 50))
	leader, fs := mustRoles(t, c)
	ctx := ctxFor(t, 150*time.Second)
	const topic = "snap"
	const total = 600
	mustTopic(t, leader, topic, map[string]any{"partitions": 2})

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
	lci, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSnap := lci.AppliedIndex - 100
	snapCtx := ctxFor(t, 30*time.Second)
	for _, n := range c.Nodes() {
		for {
			ci, err := n.Cluster(snapCtx)
			if err == nil && ci.LastSnapshotIndex > 0 && ci.LastSnapshotIndex >= wantSnap {
				break
			}
			if snapCtx.Err() != nil {
				t.Fatalf("node %s: no snapshot at index >= %d within 30 s of %d publishes (applied index %d) with --snapshot-threshold 100 --snapshot-interval 1s: %+v %v",
					n, wantSnap, total, lci.AppliedIndex, ci, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	f := fs[0]
	f.Kill()
	f.Wipe()
	f.Restart()
	if err := f.WaitReady(ctxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("wiped follower %s not ready: %v", f, err)
	}
	lci, err = leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var fci tc.ClusterInfo
	catch := ctxFor(t, 60*time.Second)
	for {
		fci, err = f.Cluster(catch)
		if err == nil && fci.AppliedIndex >= lci.AppliedIndex {
			break
		}
		if catch.Err() != nil {
			t.Fatalf("wiped follower %s: applied_index %d never reached the leader's %d (%v)", f, fci.AppliedIndex, lci.AppliedIndex, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("leader %s: applied %d, last snapshot %d; wiped follower %s: applied %d, last snapshot %d",
		leader, lci.AppliedIndex, lci.LastSnapshotIndex, f, fci.AppliedIndex, fci.LastSnapshotIndex)

	if s, err := f.Stats(ctx, topic); err != nil || s.Messages != total || s.NextOffsets() != total {
		t.Errorf("stats via wiped follower %s: messages %d, next offsets %d, err %v; want %d", f, s.Messages, s.NextOffsets(), err, total)
	}
	msgs, err := drain(ctx, f, topic, "after-wipe", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkExactly(t, "consumed via the wiped follower", values(t, distinctByPosition(msgs)), want)

	// The wiped node forwards writes and serves fresh reads.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	mustPublish(t, f, topic, "after catch-up", nil)
	got, _, err := f.Fetch(rctx, topic, "after-wipe", tc.FetchRequest{Max: 10, WaitMs: 3000})
	if err != nil || len(got) != 1 || values(t, got)[0] != "after catch-up" {
		t.Fatalf("fetch via wiped follower after a new publish: %d messages, %v", len(got), err)
	}
}
