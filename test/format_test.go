package test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// nodeStatus is the part of /v1/internal/status this file reads.
type nodeStatus struct {
	ID             string `json:"id"`
	StateFormat    int    `json:"state_format"`
	StateFormatMax int    `json:"state_format_max"`
}

// waitNodeStatus polls n's /v1/internal/status until ok accepts it.
func waitNodeStatus(ctx context.Context, n *tc.Node, what string, ok func(nodeStatus) bool) (nodeStatus, error) {
	var last nodeStatus
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := n.Do(rctx, "GET", "/v1/internal/status", nil, nil)
		cancel()
		if err == nil {
			if err = r.Expect(200); err == nil {
				var st nodeStatus
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

// A new cluster whose members all run this binary switches to the newest
// state format: every node's status and /metrics report it, and the leader
// said so in its log.
func TestStateFormatRaised(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := ctxFor(t, 60*time.Second)
	for _, n := range c.Nodes() {
		st, err := waitNodeStatus(ctx, n, "state_format 2", func(st nodeStatus) bool { return st.StateFormat == 2 })
		if err != nil {
			t.Fatal(err)
		}
		if st.StateFormatMax != 2 || st.ID != n.ID() {
			t.Fatalf("%s: status %+v, want state_format_max 2 and its own id", n, st)
		}
		if v, ok := metricValue(scrape(ctx, t, n), "mqd_state_format", nil); !ok || v != 2 {
			t.Fatalf("%s: mqd_state_format = %v (present %v), want 2", n, v, ok)
		}
	}
	// /v1/cluster: the state's format, and what each member reads.
	_, err := waitView(ctx, c.Node(0), "state format 2, every member reading it", func(ci tc.ClusterInfo) bool {
		ok := ci.StateFormat == 2 && len(ci.Nodes) == 3
		for _, n := range ci.Nodes {
			ok = ok && n.StateFormatMax == 2
		}
		return ok
	})
	if err != nil {
		t.Fatal(err)
	}
	said := 0
	for _, n := range c.Nodes() {
		b, err := os.ReadFile(n.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		said += strings.Count(string(b), "state format raised")
	}
	if said == 0 {
		t.Fatal("no node logged \"state format raised\"")
	}
}
