package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// A consumer fetching one message at a time (and acking it, so its fetches'
// raft indexes all have one parity) gets the partitions in turn across
// fetches, not one partition drained before the next; the turn is part of
// the replicated state, so it goes on where it was after the leader changes.
func TestFetchRoundRobinAcrossFetches(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader := tc.MustLeader(t, c)
	// The turn is kept from state format 3 on, raised once every member
	// has said it reads it.
	if _, err := tc.WaitView(ctx, leader, "state format raised", func(ci tc.ClusterInfo) bool { return ci.StateFormat == fsm.StateFormat }); err != nil {
		t.Fatal(err)
	}
	const topic, group = "rr", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	per := [2]int{}
	for k := 0; per[0] < 4 || per[1] < 4; k++ {
		if k > 200 {
			t.Fatalf("200 partition keys put %v messages in the two partitions", per)
		}
		r := tc.MustPublish(t, leader, topic, "m", map[string]string{"Mq-Partition-Key": fmt.Sprint("k", k)})
		per[r.Partition]++
	}
	var seq []int
	fetchOne := func(n *tc.Node) {
		t.Helper()
		msgs, _, err := n.Fetch(ctx, topic, group, tc.FetchRequest{Max: 1, LeaseMs: 60000})
		if err != nil || len(msgs) != 1 {
			t.Fatalf("fetch via %s: %d messages, %v", n, len(msgs), err)
		}
		seq = append(seq, msgs[0].Partition)
		if err := tc.AckAll(ctx, n, topic, group, msgs); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		fetchOne(leader)
	}
	// A new leader: its replica holds where the turn is.
	if err := leader.Stop(); err != nil {
		t.Fatalf("stop %s: %v", leader, err)
	}
	next, err := c.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next, err = c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		fetchOne(next)
	}
	for i := 1; i < len(seq); i++ {
		if seq[i] == seq[i-1] {
			t.Fatalf("partitions of successive one-message fetches %v (a leader change after the third): want them alternating", seq)
		}
	}
}
