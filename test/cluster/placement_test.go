package cluster

import (
	"net/http"
	"slices"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// TestTopicPlacement: GET /v1/topics/{topic} names the topic's replicas and
// their leader, and GET /v1/cluster counts the topics each member leads and
// holds (SPEC section 12), through a follower as through the leader. With
// one raft group every voter holds every topic and the leader leads them.
func TestTopicPlacement(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	for _, topic := range []string{"place-a", "place-b"} {
		tc.MustTopic(t, l, topic, nil)
	}
	tc.WaitApplied(t, c) // the follower asked below has the topics too
	var ids []string
	for _, n := range c.Nodes() {
		ids = append(ids, n.ID())
	}
	slices.Sort(ids)
	for _, n := range []*tc.Node{l, fs[0]} {
		r, err := n.Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/topics/place-a", nil, nil)
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		var got struct {
			Placement *struct {
				Replicas []string `json:"replicas"`
				Leader   string   `json:"leader"`
			} `json:"placement"`
		}
		if err == nil {
			err = r.JSON(&got)
		}
		if err != nil {
			t.Fatalf("GET topic via %s: %v", n, err)
		}
		if got.Placement == nil {
			t.Fatalf("GET topic via %s: no placement in %s", n, r.Body)
		}
		slices.Sort(got.Placement.Replicas)
		if !slices.Equal(got.Placement.Replicas, ids) || got.Placement.Leader != l.ID() {
			t.Errorf("placement via %s: %+v, want replicas %v and leader %s", n, *got.Placement, ids, l.ID())
		}

		r, err = n.Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/cluster", nil, nil)
		var ci struct {
			Nodes []struct {
				ID         string `json:"id"`
				TopicsLed  *int   `json:"topics_led"`
				TopicsHeld *int   `json:"topics_held"`
			} `json:"nodes"`
		}
		if err == nil {
			err = r.JSON(&ci)
		}
		if err != nil || len(ci.Nodes) != 3 {
			t.Fatalf("GET /v1/cluster via %s: %v %s", n, err, r.Body)
		}
		for _, m := range ci.Nodes {
			wantLed := 0
			if m.ID == l.ID() {
				wantLed = 2
			}
			if m.TopicsLed == nil || m.TopicsHeld == nil || *m.TopicsLed != wantLed || *m.TopicsHeld != 2 {
				t.Errorf("/v1/cluster via %s: member %s topics led/held %v/%v, want %d/2", n, m.ID, m.TopicsLed, m.TopicsHeld, wantLed)
			}
		}
	}
}
