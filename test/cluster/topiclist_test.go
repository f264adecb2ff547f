package cluster

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// listedTopic is a topic as GET /v1/topics lists it.
type listedTopic struct {
	Messages   uint64 `json:"messages"`
	Partitions []any  `json:"partitions"`
	Placement  struct {
		Group    string   `json:"group"`
		Replicas []string `json:"replicas"`
	} `json:"placement"`
}

// listTopics is GET /v1/topics through n, by name.
func listTopics(ctx context.Context, n *tc.Node) (map[string]listedTopic, error) {
	r, err := n.Do(ctx, http.MethodGet, "/v1/topics", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var page struct {
		Topics []struct {
			Name string `json:"name"`
			listedTopic
		} `json:"topics"`
	}
	if err == nil {
		err = r.JSON(&page)
	}
	out := map[string]listedTopic{}
	for _, t := range page.Topics {
		out[t.Name] = t.listedTopic
	}
	return out, err
}

// waitListed polls GET /v1/topics through every live node until ok holds
// for what it lists, at most 10 s.
func waitListed(t *testing.T, nodes []*tc.Node, what string, ok func(map[string]listedTopic) bool) {
	t.Helper()
	ctx := tc.CtxFor(t, 10*time.Second)
	for _, n := range nodes {
		for {
			got, err := listTopics(ctx, n)
			if err == nil && ok(got) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("GET /v1/topics through %s: %+v %v; want %s", n, got, err, what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestTopicListThroughAnyNode: GET /v1/topics, which the metadata leader
// answers, lists a topic of a data group the metadata leader holds no
// replica of with its figures, read from a member of that group, and no
// longer lists it once it is deleted. While no member of the group
// answers, the list still names the topic with its placement (no
// figures), as the directory holds it. Before, such a topic was always
// listed without figures, and after its deletion for as long as the
// directory placed it.
func TestTopicListThroughAnyNode(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithDataGroups())
	nodes := c.Nodes()
	ctx := tc.CtxFor(t, 90*time.Second)
	meta := tc.MustLeader(t, c).ID()
	// Single-replica topics go to the least loaded node: the second lands
	// on another node than the first, so one of them is off the metadata
	// leader.
	away, held := "", ""
	for i := range 3 {
		tp := fmt.Sprintf("list-solo-%d", i)
		tc.MustTopic(t, nodes[i], tp, map[string]any{"replicas": 1, "partitions": 2})
		_, _, reps, err := systest.TopicPlacement(ctx, nodes[i], tp)
		if err != nil || len(reps) != 1 {
			t.Fatalf("topic %s: replicas %v %v, want 1", tp, reps, err)
		}
		if reps[0] != meta && away == "" {
			away, held = tp, reps[0]
		}
	}
	if away == "" {
		t.Fatalf("every single-replica topic is on the metadata leader %s; want one elsewhere", meta)
	}
	for k := range 4 {
		if _, err := systest.PublishKeyedRetry(ctx, nodes, away, fmt.Sprintf("%s-%d", away, k)); err != nil {
			t.Fatal(err)
		}
	}
	withFigures := func(got map[string]listedTopic) bool {
		a, ok := got[away]
		return ok && a.Messages == 4 && len(a.Partitions) == 2 && a.Placement.Group != "" && len(a.Placement.Replicas) == 1 && a.Placement.Replicas[0] == held
	}
	waitListed(t, nodes, fmt.Sprintf("%s with its 4 messages and 2 partitions, placed on %s", away, held), withFigures)

	// Its only member stopped: the list still names it, with the
	// placement the directory holds and no figures.
	holder := c.NodeByID(held)
	if err := holder.Stop(); err != nil {
		t.Fatal(err)
	}
	var live []*tc.Node
	for _, n := range nodes {
		if n != holder {
			live = append(live, n)
		}
	}
	waitListed(t, live, away+" named without figures", func(got map[string]listedTopic) bool {
		a, ok := got[away]
		return ok && a.Partitions == nil && len(a.Placement.Replicas) == 1 && a.Placement.Replicas[0] == held
	})
	holder.Restart()
	if err := holder.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	waitListed(t, nodes, away+" with its figures again", withFigures)

	// Deleted: gone from the list through every node.
	r, err := nodes[0].Do(ctx, http.MethodDelete, "/v1/topics/"+away, nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatal(err)
	}
	waitListed(t, nodes, away+" gone", func(got map[string]listedTopic) bool {
		_, ok := got[away]
		return !ok && len(got) == 2
	})
}
