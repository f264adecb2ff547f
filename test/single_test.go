package test

import (
	"fmt"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// A node started without --join bootstraps a cluster of its own, serves the
// whole API, and keeps acknowledged messages across kill -9.
func TestSingleNode(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 60*time.Second)
	const topic = "single"
	tc.MustTopic(t, n, topic, map[string]any{"partitions": 2})
	want := map[string]bool{}
	for i := range 10 {
		p := fmt.Sprintf("one-%d", i)
		want[p] = true
		tc.MustPublish(t, n, topic, p, nil)
	}
	n.Kill()
	n.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("single node not ready after kill -9 and restart: %v", err)
	}
	msgs, err := tc.Drain(ctx, n, topic, "g", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	systest.CheckExactly(t, "single node after restart", systest.Values(t, systest.DistinctByPosition(msgs)), want)
}

// A long poll may wait longer than the request's commit deadline
// (Mq-Timeout-Ms): a message that arrives after the deadline but within
// wait_ms is still delivered, not answered 503.
func TestLongPollOutlastsCommitDeadline(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 30*time.Second)
	tc.MustTopic(t, n, "lp", nil)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		r, err := n.Do(ctx, "POST", "/v1/topics/lp/groups/g/fetch", map[string]any{"max": 1, "wait_ms": 4000},
			map[string]string{"Mq-Timeout-Ms": "500"})
		if err == nil {
			err = r.Expect(200)
		}
		if err == nil {
			var body struct{ Messages []tc.Message }
			if err = r.JSON(&body); err == nil && len(body.Messages) != 1 {
				err = fmt.Errorf("got %d messages, want 1: %s", len(body.Messages), r.Body)
			}
		}
		done <- err
	}()
	time.Sleep(1500 * time.Millisecond) // past the 500 ms commit deadline
	tc.MustPublish(t, n, "lp", "late", nil)
	if err := <-done; err != nil {
		t.Fatalf("fetch waiting 4 s with Mq-Timeout-Ms 500: %v", err)
	}
	if el := time.Since(start); el > 3500*time.Millisecond {
		t.Errorf("fetch answered after %v, want soon after the publish at 1.5 s", el)
	}
}
