package systest

import (
	"context"
	"fmt"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// Healthy: want voters, exactly one leader, the others followers,
// everyone heard from recently.
func Healthy(want map[string]bool) func(tc.ClusterInfo) bool {
	return func(ci tc.ClusterInfo) bool {
		leaders := 0
		if len(ci.Nodes) != len(want) || ci.Leader == nil {
			return false
		}
		for _, n := range ci.Nodes {
			if !want[n.ID] || !n.Voter || n.LastContactMs < 0 || n.LastContactMs > 3000 || n.CommitIndex == 0 {
				return false
			}
			switch n.State {
			case "leader":
				leaders++
			case "follower":
			default:
				return false
			}
		}
		return leaders == 1
	}
}

// NodeStatus is the part of /v1/internal/status this file reads.
type NodeStatus struct {
	ID             string `json:"id"`
	StateFormat    int    `json:"state_format"`
	StateFormatMax int    `json:"state_format_max"`
}

// WaitNodeStatus polls n's /v1/internal/status until ok accepts it.
func WaitNodeStatus(ctx context.Context, n *tc.Node, what string, ok func(NodeStatus) bool) (NodeStatus, error) {
	var last NodeStatus
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := n.Do(rctx, "GET", "/v1/internal/status", nil, nil)
		cancel()
		if err == nil {
			if err = r.Expect(200); err == nil {
				var st NodeStatus
				if err = r.JSON(&st); err == nil && ok(st) {
					return st, nil
				}
				last = st
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("%w: /v1/internal/status of %s never showed %s: last %+v (%v)", ctx.Err(), n, what, last, lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
