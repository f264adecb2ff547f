package testcluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DescribeCluster renders a /v1/cluster answer's nodes for failure messages.
func DescribeCluster(ci ClusterInfo) string {
	var parts []string
	for _, n := range ci.Nodes {
		parts = append(parts, fmt.Sprintf("%s=%s(voter %v, contact %dms, commit %d)", n.ID, n.State, n.Voter, n.LastContactMs, n.CommitIndex))
	}
	return fmt.Sprintf("leader %q: %s", ci.LeaderID(), strings.Join(parts, " "))
}

// WaitView polls n's /v1/cluster until ok accepts it.
func WaitView(ctx context.Context, n *Node, what string, ok func(ClusterInfo) bool) (ClusterInfo, error) {
	var last ClusterInfo
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ci, err := n.Cluster(rctx)
		cancel()
		if err == nil && ok(ci) {
			return ci, nil
		}
		last, lastErr = ci, err
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("%s: /v1/cluster of %s never showed %s: last %s (%v)", ctx.Err(), n, what, DescribeCluster(last), lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitApplied waits until every live node has applied what the leader
// had committed when called, so that a view taken after is not one a
// lagging follower changes later; with data groups, in each data group it
// holds too, what the group's members had committed.
func WaitApplied(t testing.TB, c *Cluster) {
	t.Helper()
	ctx := CtxFor(t, 30*time.Second)
	l, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lci, err := l.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Live() {
		for {
			ci, err := n.Cluster(ctx)
			if err == nil && ci.AppliedIndex >= lci.CommitIndex {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: not caught up to %d: %v %+v", n, lci.CommitIndex, err, ci)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitGroupsApplied(ctx, t, c.Live())
}

// waitGroupsApplied waits until each of nodes has applied, in every data
// group it holds, the highest commit index the nodes report for the group
// (mqd_raft_commit_index and mqd_raft_applied_index on /metrics).
func waitGroupsApplied(ctx context.Context, t testing.TB, nodes []*Node) {
	t.Helper()
	want := map[string]float64{}
	for _, n := range nodes {
		for g, v := range groupSeries(ctx, n, "mqd_raft_commit_index") {
			if g != "default" {
				want[g] = max(want[g], v)
			}
		}
	}
	for _, n := range nodes {
		for g, commit := range want {
			for {
				applied, held := groupSeries(ctx, n, "mqd_raft_applied_index")[g]
				if !held || applied >= commit {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("%s: data group %s not caught up to %.0f (applied %.0f)", n, g, commit, applied)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// groupSeries are the values of a per-raft-group gauge on n's /metrics,
// by raft_group (none when n does not answer).
func groupSeries(ctx context.Context, n *Node, name string) map[string]float64 {
	out := map[string]float64{}
	r, err := n.Do(ctx, "GET", "/metrics", nil, nil)
	if err != nil || r.Status != 200 {
		return out
	}
	prefix := name + `{raft_group="`
	for _, l := range strings.Split(string(r.Body), "\n") {
		rest, ok := strings.CutPrefix(l, prefix)
		if !ok {
			continue
		}
		g, val, ok := strings.Cut(rest, `"} `)
		if v, err := strconv.ParseFloat(val, 64); ok && err == nil {
			out[g] = v
		}
	}
	return out
}
