package cluster

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestDataGroupsGrowAsNodesJoin: data groups are the default, and a topic
// created on a one-node cluster (replicas 3: every node, one) gets its
// three replicas as two nodes join, with no rebalance asked, while a topic
// created with replicas 1 stays on one; the grown topic then survives the
// loss of the node it was created on. Before, the group stayed at one
// member for good: a later node held nothing of it.
func TestDataGroupsGrowAsNodesJoin(t *testing.T) {
	c := tc.Start(t, 1, tc.WithDataGroups())
	n1 := c.Node(0)
	ctx := tc.CtxFor(t, 3*time.Minute)
	tc.MustTopic(t, n1, "grow", nil)
	tc.MustTopic(t, n1, "grow-one", map[string]any{"replicas": 1})
	for i := range 10 {
		if _, err := systest.PublishKeyedRetry(ctx, []*tc.Node{n1}, "grow", fmt.Sprintf("before-join-%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if g, _, reps, err := systest.TopicPlacement(ctx, n1, "grow"); err != nil || g == "" || !slices.Equal(reps, []string{n1.ID()}) {
		t.Fatalf("on one node: placement of grow %s %v (%v), want a data group on %s", g, reps, err, n1.ID())
	}
	n2, n3 := c.AddNode("n2"), c.AddNode("n3")
	if _, err := c.WaitReady(ctx); err != nil {
		t.Fatalf("nodes joining: %v", err)
	}
	for {
		_, _, reps, err := systest.TopicPlacement(ctx, n1, "grow")
		var st tc.TopicStats
		r, serr := n3.Do(ctx, http.MethodGet, "/v1/topics/grow?stale=ok", nil, nil)
		if serr == nil {
			serr = r.Expect(http.StatusOK)
		}
		if serr == nil {
			serr = r.JSON(&st)
		}
		if err == nil && len(reps) == 3 && serr == nil && st.NextOffsets() == 10 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topic grow: replicas %v (%v); %s's replica %+v (%v); want 3 replicas, 10 messages on %s", reps, err, n3, st, serr, n3)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, _, reps, err := systest.TopicPlacement(ctx, n2, "grow-one"); err != nil || len(reps) != 1 {
		t.Fatalf("topic grow-one: replicas %v (%v), want 1", reps, err)
	}
	n1.Kill()
	via := []*tc.Node{n2, n3}
	if _, err := systest.PublishKeyedRetry(ctx, via, "grow", "after-kill"); err != nil {
		t.Fatalf("publish with the first node down: %v", err)
	}
	for {
		var st tc.TopicStats
		r, err := n2.Do(ctx, http.MethodGet, "/v1/topics/grow", nil, nil)
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err == nil {
			err = r.JSON(&st)
		}
		if err == nil && st.NextOffsets() == 11 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic grow with %s down: %+v (%v), want 11 messages", n1, st, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
