package test

import (
	"fmt"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// A node started without --join bootstraps a cluster of its own, serves the
// whole API, and keeps acknowledged messages across kill -9.
func TestSingleNode(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := ctxFor(t, 60*time.Second)
	const topic = "single"
	mustTopic(t, n, topic, map[string]any{"partitions": 2})
	want := map[string]bool{}
	for i := range 10 {
		p := fmt.Sprintf("one-%d", i)
		want[p] = true
		mustPublish(t, n, topic, p, nil)
	}
	n.Kill()
	n.Restart()
	if _, err := c.WaitReady(ctxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("single node not ready after kill -9 and restart: %v", err)
	}
	msgs, err := drain(ctx, n, topic, "g", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	checkExactly(t, "single node after restart", values(t, distinctByPosition(msgs)), want)
}
