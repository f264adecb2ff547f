package systest

import (
	"context"
	"net/http"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// TopicPlacement is a topic's placement as GET /v1/topics/{topic} answers
// it through n.
func TopicPlacement(ctx context.Context, n *tc.Node, topic string) (group, leader string, replicas []string, err error) {
	r, err := n.Do(ctx, http.MethodGet, "/v1/topics/"+topic, nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var got struct {
		Placement struct {
			Group    string   `json:"group"`
			Replicas []string `json:"replicas"`
			Leader   string   `json:"leader"`
		} `json:"placement"`
	}
	if err == nil {
		err = r.JSON(&got)
	}
	return got.Placement.Group, got.Placement.Leader, got.Placement.Replicas, err
}

// WaitSpread waits (bounded) until the topics' data groups are led by
// len(topics) distinct nodes, and answers each topic's leader.
func WaitSpread(t *testing.T, via *tc.Node, topics []string) map[string]string {
	t.Helper()
	ctx := tc.CtxFor(t, 60*time.Second)
	for {
		leaders := map[string]string{}
		distinct := map[string]bool{}
		for _, tp := range topics {
			g, l, reps, err := TopicPlacement(ctx, via, tp)
			if err == nil && g != "" && l != "" && len(reps) == min(3, len(topics)) {
				leaders[tp] = l
				distinct[l] = true
			}
		}
		if len(distinct) == len(topics) {
			return leaders
		}
		if ctx.Err() != nil {
			t.Fatalf("the data groups of %v are not led by %d distinct nodes: %v", topics, len(topics), leaders)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ClusterGroups is GET /v1/cluster's groups through n.
func ClusterGroups(ctx context.Context, n *tc.Node) (map[string][]string, error) {
	r, err := n.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var ci struct {
		Groups []struct {
			ID      string   `json:"id"`
			Members []string `json:"members"`
		} `json:"groups"`
	}
	if err == nil {
		err = r.JSON(&ci)
	}
	out := map[string][]string{}
	for _, g := range ci.Groups {
		out[g.ID] = g.Members
	}
	return out, err
}

// ClusterDataGroup is one data group as GET /v1/cluster lists it.
type ClusterDataGroup struct {
	ID      string   `json:"id"`
	Members []string `json:"members"`
	Leader  string   `json:"leader"`
	Topics  int      `json:"topics"`
}
