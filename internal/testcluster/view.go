package testcluster

import (
	"context"
	"fmt"
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
// lagging follower changes later.
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
}
