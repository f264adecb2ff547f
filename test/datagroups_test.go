package test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// topicPlacement is a topic's placement as GET /v1/topics/{topic} answers
// it through n.
func topicPlacement(ctx context.Context, n *tc.Node, topic string) (group, leader string, replicas []string, err error) {
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

// waitSpread waits (bounded) until the topics' data groups are led by
// len(topics) distinct nodes, and answers each topic's leader.
func waitSpread(t *testing.T, via *tc.Node, topics []string) map[string]string {
	t.Helper()
	ctx := ctxFor(t, 60*time.Second)
	for {
		leaders := map[string]string{}
		distinct := map[string]bool{}
		for _, tp := range topics {
			g, l, reps, err := topicPlacement(ctx, via, tp)
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

// TestDataGroups: with --data-groups, three topics on three nodes go to
// three data groups led by three different nodes (SPEC section 12); every
// node serves every topic; keys deduplicate per topic; the kill -9 of one
// group's leader loses no acknowledged publish of any topic; the node
// comes back with its groups; GET /v1/topics and /v1/cluster see them all.
func TestDataGroups(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	topics := []string{"dg-a", "dg-b", "dg-c"}
	for i, tp := range topics {
		mustTopic(t, nodes[(i+1)%3], tp, map[string]any{"partitions": 2})
	}
	leaders := waitSpread(t, nodes[0], topics)

	ctx := ctxFor(t, 90*time.Second)
	acked := map[string][]string{}
	publishAll := func(round string, via []*tc.Node) {
		for _, tp := range topics {
			for i, n := range via {
				v := fmt.Sprintf("%s-%s-%d", tp, round, i)
				pr, err := publishRetry(ctx, []*tc.Node{n}, tp, v)
				if err != nil {
					t.Fatalf("publish %s via %s: %v", v, n, err)
				}
				if pr.Topic != tp {
					t.Fatalf("publish to %s answered topic %q", tp, pr.Topic)
				}
				acked[tp] = append(acked[tp], v)
			}
		}
	}
	publishAll("first", nodes)

	// A key deduplicates within its topic, through any node.
	for i, n := range nodes {
		pr, _, err := n.Publish(ctx, topics[0], []byte("keyed"), map[string]string{"Idempotency-Key": "only-once"})
		if err != nil || pr.Duplicate != (i > 0) {
			t.Fatalf("keyed publish %d via %s: %+v %v, want duplicate=%v", i, n, pr, err, i > 0)
		}
	}
	acked[topics[0]] = append(acked[topics[0]], "keyed")

	// Kill -9 the leader of the first topic's group: its topics fail over,
	// the others' groups keep their leaders or elect new ones.
	victim := c.NodeByID(leaders[topics[0]])
	victim.Kill()
	var live []*tc.Node
	for _, n := range nodes {
		if n != victim {
			live = append(live, n)
		}
	}
	publishAll("after-kill", live)

	for _, tp := range topics {
		msgs, err := drain(ctx, live[0], tp, "workers", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got := values(t, distinctByPosition(msgs))
		slices.Sort(got)
		want := slices.Clone(acked[tp])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("topic %s consumed %v, want every acknowledged publish once: %v", tp, got, want)
		}
	}

	// The killed node reopens its data groups from its data dir and
	// catches up: it answers every topic's stats itself (stale reads).
	victim.Restart()
	if err := victim.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		want := int64(len(acked[tp]))
		for {
			var st tc.TopicStats
			r, err := victim.Do(ctx, http.MethodGet, "/v1/topics/"+tp+"?stale=ok", nil, nil)
			if err == nil {
				err = r.JSON(&st)
			}
			if err == nil && st.NextOffsets() == want {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("restarted %s: topic %s stats %+v %v, want %d messages", victim, tp, st, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	r, err := victim.Do(ctx, http.MethodGet, "/v1/topics", nil, nil)
	var list struct {
		Topics []struct {
			Name string `json:"name"`
		} `json:"topics"`
	}
	if err == nil {
		err = r.JSON(&list)
	}
	if err != nil || len(list.Topics) != 3 {
		t.Fatalf("GET /v1/topics: %v %s", err, r.Body)
	}
	r, err = victim.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
	var ci struct {
		Groups []struct {
			ID      string   `json:"id"`
			Members []string `json:"members"`
			Topics  int      `json:"topics"`
		} `json:"groups"`
		Nodes []struct {
			ID         string `json:"id"`
			TopicsHeld int    `json:"topics_held"`
		} `json:"nodes"`
	}
	if err == nil {
		err = r.JSON(&ci)
	}
	if err != nil || len(ci.Groups) != 3 {
		t.Fatalf("GET /v1/cluster: %v, want 3 groups: %s", err, r.Body)
	}
	for _, n := range ci.Nodes {
		if n.TopicsHeld != 3 {
			t.Errorf("node %s holds %d topics, want 3", n.ID, n.TopicsHeld)
		}
	}
}

// TestDataGroupsFiveNodes: on five nodes each topic has three replicas, the
// five groups are led by five nodes, and a node that holds no replica of a
// topic forwards its requests to one that does.
func TestDataGroupsFiveNodes(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 5, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	var topics []string
	for i := range 5 {
		tp := fmt.Sprintf("dg5-%d", i)
		topics = append(topics, tp)
		mustTopic(t, nodes[i], tp, nil)
	}
	ctx := ctxFor(t, 60*time.Second)
	for _, tp := range topics {
		_, _, reps, err := topicPlacement(ctx, nodes[0], tp)
		if err != nil || len(reps) != 3 {
			t.Fatalf("topic %s: replicas %v %v, want 3", tp, reps, err)
		}
		outside := 0
		for _, n := range nodes {
			if slices.Contains(reps, n.ID()) {
				continue
			}
			outside++
			v := tp + "-via-" + n.ID()
			if _, err := publishRetry(ctx, []*tc.Node{n}, tp, v); err != nil {
				t.Fatalf("publish to %s through %s, which holds no replica: %v", tp, n, err)
			}
			msgs, err := drain(ctx, n, tp, "g", time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := values(t, msgs); len(got) != 1 || got[0] != v {
				t.Fatalf("fetch %s through %s: %v, want [%s]", tp, n, got, v)
			}
		}
		if outside != 2 {
			t.Fatalf("topic %s: %d nodes outside its replicas %v, want 2", tp, outside, reps)
		}
	}
	waitSpread(t, nodes[4], topics)
}
