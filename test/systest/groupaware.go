package systest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// Helpers for system tests that run a mechanism of a raft group both on
// the default group (--data-groups=false, the harness's default) and on a
// data group (tc.WithDataGroups()): the group a topic lives in, its files
// and its figures on one node.

// GroupVariants runs fn once on the single group and once on data groups.
func GroupVariants(t *testing.T, fn func(t *testing.T, opts ...tc.Option)) {
	t.Run("default-group", func(t *testing.T) { fn(t) })
	t.Run("data-group", func(t *testing.T) { fn(t, tc.WithDataGroups()) })
}

// TopicGroup is the raft group topic lives in as n answers it: its data
// group's id, or "default".
func TopicGroup(t testing.TB, n *tc.Node, topic string) string {
	t.Helper()
	g, _, _, err := TopicPlacement(tc.CtxFor(t, 10*time.Second), n, topic)
	if err != nil {
		t.Fatalf("placement of %s via %s: %v", topic, n, err)
	}
	if g == "" {
		return "default"
	}
	return g
}

// GroupDir is raft group g's directory on n (replica.GroupDir).
func GroupDir(n *tc.Node, g string) string {
	if g == "default" {
		return n.DataDir()
	}
	return filepath.Join(n.DataDir(), "groups", g)
}

// GroupFigure is the value of raft group g's series name on n's /metrics
// (false when n has no such series: it holds no replica of g).
func GroupFigure(ctx context.Context, t testing.TB, n *tc.Node, name, g string) (float64, bool) {
	t.Helper()
	return MetricValue(Scrape(ctx, t, n), name, map[string]string{"raft_group": g})
}

// GroupApplied is raft group g's applied index on n.
func GroupApplied(t testing.TB, n *tc.Node, g string) uint64 {
	t.Helper()
	v, ok := GroupFigure(tc.CtxFor(t, 10*time.Second), t, n, "mqd_raft_applied_index", g)
	if !ok {
		t.Fatalf("%s: no mqd_raft_applied_index of group %s", n, g)
	}
	return uint64(v)
}

// GroupRoles is PlacedRoles of a topic placed on three nodes: the
// group's leader and its two followers.
func GroupRoles(t testing.TB, c *tc.Cluster, topic string) (l, f1, f2 *tc.Node) {
	t.Helper()
	l, fs := PlacedRoles(t, c, topic)
	if len(fs) != 2 {
		t.Fatalf("topic %s has %d replicas, want 3", topic, len(fs)+1)
	}
	return l, fs[0], fs[1]
}

// GroupCommit is the highest commit index of raft group g among nodes.
func GroupCommit(t testing.TB, nodes []*tc.Node, g string) uint64 {
	t.Helper()
	var most uint64
	for _, n := range nodes {
		if v, ok := GroupFigure(tc.CtxFor(t, 10*time.Second), t, n, "mqd_raft_commit_index", g); ok {
			most = max(most, uint64(v))
		}
	}
	return most
}

// GroupSnapshot is the index of n's latest snapshot of raft group g.
func GroupSnapshot(ctx context.Context, t testing.TB, n *tc.Node, g string) uint64 {
	t.Helper()
	v, ok := GroupFigure(ctx, t, n, "mqd_raft_last_snapshot_index", g)
	if !ok {
		t.Fatalf("%s: no mqd_raft_last_snapshot_index of group %s", n, g)
	}
	return uint64(v)
}

// PlacedRoles waits (bounded) until topic's data group is led by its
// preferred leader, and answers that leader and the group's other members.
func PlacedRoles(t testing.TB, c *tc.Cluster, topic string) (*tc.Node, []*tc.Node) {
	t.Helper()
	ctx := tc.CtxFor(t, 30*time.Second)
	for {
		_, leader, reps, err := TopicPlacement(ctx, c.Node(0), topic)
		if err == nil && len(reps) > 1 && leader == reps[0] {
			var others []*tc.Node
			for _, id := range reps[1:] {
				others = append(others, c.NodeByID(id))
			}
			return c.NodeByID(leader), others
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s's group is not led by its preferred leader: leader %q, replicas %v, %v", topic, leader, reps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
