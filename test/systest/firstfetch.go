package systest

import (
	"fmt"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// A group's first fetch creates it, even on an empty topic and through a
// follower (SPEC §5): with retention_ms 0 a message is kept until every
// group has acked it, so a consumer that started before its producers must
// still get every message another group acks and retention then trims.
func CheckFirstFetchCreatesGroup(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	ctx := tc.CtxFor(t, 60*time.Second)
	const topic, control = "first-fetch", "first-fetch-control"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3})
	tc.MustTopic(t, leader, control, nil)

	msgs, _, err := fs[0].Fetch(ctx, topic, "A", tc.FetchRequest{Max: 10})
	if err != nil || len(msgs) != 0 {
		t.Fatalf("first fetch of A on the empty topic via follower %s: %d messages, %v", fs[0], len(msgs), err)
	}
	// A long-poll through a follower waits there (it forwards only short
	// fetches): its first fetch must still create the group at once.
	if msgs, _, err := fs[0].Fetch(ctx, topic, "A-poll", tc.FetchRequest{Max: 10, WaitMs: 300}); err != nil || len(msgs) != 0 {
		t.Fatalf("first long-poll of A-poll on the empty topic via follower %s: %d messages, %v", fs[0], len(msgs), err)
	}
	st, err := leader.Stats(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"A", "A-poll"} {
		if _, ok := st.Groups[g]; !ok {
			t.Fatalf("after %s's first fetch the topic's groups are %v: the fetch did not create %s", g, st.Groups, g)
		}
	}

	want := map[string]bool{}
	for i := range 30 {
		p := fmt.Sprintf("ff-%02d", i)
		want[p] = true
		tc.MustPublish(t, c.Node(i%3), topic, p, map[string]string{"Idempotency-Key": p})
	}
	got, err := tc.Drain(ctx, fs[1%len(fs)], topic, "B", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	CheckExactly(t, "group B", Values(t, DistinctByPosition(got)), want)

	// Retention runs over every topic on each leader tick: once the
	// control topic (acked after B's acks above) is trimmed, retention has
	// had its chance to trim what B acked.
	tc.MustPublish(t, leader, control, "c", nil)
	if _, err := tc.Drain(ctx, leader, control, "B", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := PollStats(ctx, leader, control, func(s tc.TopicStats) bool { return s.Messages == 0 }); err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"A", "A-poll"} {
		got, err = tc.Drain(ctx, fs[0], topic, g, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		CheckExactly(t, "group "+g+" (first fetched before any publish)", Values(t, DistinctByPosition(got)), want)
	}
}
