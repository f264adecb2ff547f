package systest

import (
	"context"
	"testing"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// ProcessAnswer is the 200 of POST .../process.
type ProcessAnswer struct {
	Acked     int                `json:"acked"`
	Duplicate bool               `json:"duplicate"`
	Results   []tc.PublishResult `json:"results"`
}

func MessagesIn(ctx context.Context, t *testing.T, n *tc.Node, topic string) int64 {
	t.Helper()
	st, err := n.Stats(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return st.NextOffsets()
}

// WaitFormat3 waits until every node applies a state format that has
// process (format 3 or later).
func WaitFormat3(ctx context.Context, t *testing.T, c *tc.Cluster) {
	t.Helper()
	for _, n := range c.Nodes() {
		if _, err := tc.WaitView(ctx, n, "state format with process", func(ci tc.ClusterInfo) bool { return ci.StateFormat >= fsm.ProcessFormat }); err != nil {
			t.Fatal(err)
		}
	}
}
