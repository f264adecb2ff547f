package test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// Query parameters, numeric headers and dead-letter ids at their edges: a
// parameter a route does not take, one given twice, a cursor that is not
// UTF-8 once decoded, a number with a sign, a replay of id 0 are each a
// 400 with a JSON error, and none of them, nor a replay of "all" on a group
// with no dead letters, writes anything: the commit index does not move.
func TestQueryAndNumberEdgesChangeNothing(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := tc.CtxFor(t, 60*time.Second)
	n := tc.MustLeader(t, c)
	tc.MustTopic(t, n, "q", nil)
	tc.MustPublish(t, n, "q", "one", nil)
	if r, err := n.Do(ctx, http.MethodPut, "/v1/topics/q/groups/empty", nil, nil); err != nil || r.Status/100 != 2 {
		t.Fatalf("create group: %v %v", r, err)
	}
	const (
		dlq    = "/v1/topics/q/groups/empty/dlq"
		replay = dlq + "/replay"
		pub    = "/v1/topics/q/messages"
	)
	before := settledCommit(ctx, t, n)
	cases := []systest.BadCase{
		{Name: "topics limit twice", Method: "GET", Path: "/v1/topics?limit=1&limit=2"},
		{Name: "topics after twice", Method: "GET", Path: "/v1/topics?after=a&after=b"},
		{Name: "topics unknown parameter", Method: "GET", Path: "/v1/topics?limt=1"},
		{Name: "topics after %ff", Method: "GET", Path: "/v1/topics?after=%ff"},
		{Name: "topics after cut UTF-8", Method: "GET", Path: "/v1/topics?after=caf%C3"},
		{Name: "topics after overlong NUL", Method: "GET", Path: "/v1/topics?after=%C0%80"},
		{Name: "topics parameter name %fe", Method: "GET", Path: "/v1/topics?a%fe=1"},
		{Name: "topics limit +5", Method: "GET", Path: "/v1/topics?limit=+5"},
		{Name: "topics limit %2B5", Method: "GET", Path: "/v1/topics?limit=%2B5"},
		{Name: "dlq limit twice", Method: "GET", Path: dlq + "?limit=1&limit=2"},
		{Name: "dlq after twice", Method: "GET", Path: dlq + "?after=1&after=2"},
		{Name: "dlq key twice", Method: "GET", Path: dlq + "?idempotency_key=a&idempotency_key=b"},
		{Name: "dlq unknown parameter", Method: "GET", Path: dlq + "?cursor=1"},
		{Name: "dlq after %ff", Method: "GET", Path: dlq + "?after=%ff"},
		{Name: "dlq key %ff", Method: "GET", Path: dlq + "?idempotency_key=%ff"},
		{Name: "dlq after +1", Method: "GET", Path: dlq + "?after=%2B1"},
		{Name: "publish takes no parameter", Method: "POST", Path: pub + "?partition=1", Body: "x"},
		{Name: "put topic takes no parameter", Method: "PUT", Path: "/v1/topics/q2?partitions=2", Body: `{}`},
		{Name: "replay takes no parameter", Method: "POST", Path: replay + "?all=true", Body: `{"all":true}`},
		{Name: "replay id 0", Method: "POST", Path: replay, Body: `{"ids":[0]}`},
		{Name: "replay ids 1 and 0", Method: "POST", Path: replay, Body: `{"ids":[1,0]}`},
		{Name: "dlq delete id +1", Method: "DELETE", Path: dlq + "/+1"},
		{Name: "publish Mq-Delay-Ms +5", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "+5"}},
		{Name: "publish Mq-Max-Retry +1", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Max-Retry": "+1"}},
		{Name: "publish Mq-Backoff-Base-Ms +10", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Backoff-Base-Ms": "+10"}},
		{Name: "publish Mq-Backoff-Jitter-Ms +10", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Backoff-Jitter-Ms": "+10"}},
		{Name: "publish Mq-Producer-Seq +1", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "+1"}},
		{Name: "publish Mq-Timeout-Ms +100", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Timeout-Ms": "+100"}},
		{Name: "publish Mq-Delay-Ms 5_0", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "5_0"}},
	}
	for _, bc := range cases {
		h := http.Header{}
		for k, v := range bc.Hdr {
			h.Set(k, v)
		}
		r, err := n.DoHeader(ctx, bc.Method, bc.Path, bc.Body, h)
		if err != nil {
			t.Fatalf("%s: %v", bc.Name, err)
		}
		if r.Status != http.StatusBadRequest {
			t.Errorf("%s: %s %s: status %d %s, want 400", bc.Name, bc.Method, bc.Path, r.Status, systest.Shorten(string(r.Body)))
			continue
		}
		if _, err := r.CheckError(); err != nil {
			t.Errorf("%s: %v", bc.Name, err)
		}
	}
	mid := settledCommit(ctx, t, n)
	if mid != before {
		t.Errorf("commit index %d before the bad requests, %d after: they wrote %d entries", before, mid, mid-before)
	}
	// Nothing to replay: 200, accepted 0, and no raft entry.
	r, err := n.Do(ctx, http.MethodPost, replay, map[string]any{"all": true}, nil)
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"accepted":0`) {
		t.Fatalf("replay all of an empty dead-letter store: %v %v, want 200 accepted 0", r, err)
	}
	if r, err := n.Do(ctx, http.MethodPost, "/v1/topics/q/groups/nope/dlq/replay", map[string]any{"all": true}, nil); err != nil || r.Status != http.StatusNotFound {
		t.Errorf("replay all of a missing group: %v %v, want 404", r, err)
	}
	if after := settledCommit(ctx, t, n); after != mid {
		t.Errorf("commit index %d before the replay of all on a group with no dead letters, %d after: it wrote %d entries", mid, after, after-mid)
	}
	// Positive controls: the parameters each route takes, once each.
	for _, p := range []string{"/v1/topics?limit=1&after=", "/v1/topics?after=q", dlq + "?limit=5&after=0&idempotency_key=k"} {
		if r, err := n.Do(ctx, http.MethodGet, p, nil, nil); err != nil || r.Status != http.StatusOK {
			t.Errorf("GET %s: %v %v, want 200", p, r, err)
		}
	}
	tc.MustPublish(t, n, "q", "two", map[string]string{"Mq-Delay-Ms": "5", "Mq-Timeout-Ms": "5000"})
}

// settledCommit answers the node's commit index once everything committed
// is applied.
func settledCommit(ctx context.Context, t *testing.T, n *tc.Node) uint64 {
	t.Helper()
	ci, err := tc.WaitView(ctx, n, "applied to commit", func(ci tc.ClusterInfo) bool {
		return ci.CommitIndex > 0 && ci.AppliedIndex >= ci.CommitIndex
	})
	if err != nil {
		t.Fatal(err)
	}
	return ci.CommitIndex
}
