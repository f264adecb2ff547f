package systest

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// RtDeadLetter is one entry of GET .../dlq.
type RtDeadLetter struct {
	ID             uint64            `json:"id"`
	Partition      int               `json:"partition"`
	Offset         int64             `json:"offset"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	Attrs          map[string]string `json:"attrs"`
	PublishedAt    string            `json:"published_at"`
	RejectReason   string            `json:"reject_reason"`
	RetryCount     int               `json:"retry_count"`
	DeadAt         string            `json:"dead_at"`
	History        []struct {
		At     string `json:"at"`
		Kind   string `json:"kind"`
		Reason string `json:"reason"`
		Node   string `json:"node"`
	} `json:"history"`
}

func (d RtDeadLetter) Value() string {
	b, err := base64.StdEncoding.DecodeString(d.ValueB64)
	if err != nil {
		return "<bad base64 " + d.ValueB64 + ">"
	}
	return string(b)
}

type rtDLQPage struct {
	DeadLetters []RtDeadLetter `json:"dead_letters"`
	NextAfter   *uint64        `json:"next_after"`
}

func RtGroupPath(topic, group string) string {
	return "/v1/topics/" + url.PathEscape(topic) + "/groups/" + url.PathEscape(group)
}

// RtStats reads one group's stats; ok is false if the group is not listed.
func RtStats(ctx context.Context, n *tc.Node, topic, group string) (tc.GroupStats, bool, error) {
	st, err := n.Stats(ctx, topic)
	if err != nil {
		return tc.GroupStats{}, false, err
	}
	g, ok := st.Groups[group]
	return g, ok, nil
}

// RtListDLQ is GET .../dlq with query (e.g. "limit=3&after=7").
func RtListDLQ(ctx context.Context, n *tc.Node, topic, group, query string) (rtDLQPage, error) {
	var p rtDLQPage
	path := RtGroupPath(topic, group) + "/dlq"
	if query != "" {
		path += "?" + query
	}
	r, err := n.Do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return p, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return p, err
	}
	return p, r.JSON(&p)
}

func RtMustListDLQ(t *testing.T, n *tc.Node, topic, group, query string) rtDLQPage {
	t.Helper()
	p, err := RtListDLQ(tc.CtxFor(t, 10*time.Second), n, topic, group, query)
	if err != nil {
		t.Fatalf("GET dlq of %s/%s ?%s via %s: %v", topic, group, query, n, err)
	}
	return p
}

// RtWaitDLQ polls the group's dead letters until there are want of them.
func RtWaitDLQ(t *testing.T, n *tc.Node, topic, group string, want int, d time.Duration) []RtDeadLetter {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		p := RtMustListDLQ(t, n, topic, group, "limit=1000")
		if len(p.DeadLetters) == want {
			return p.DeadLetters
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s: %d dead letters after %v, want %d: %+v", topic, group, len(p.DeadLetters), d, want, p.DeadLetters)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RtFetch long-polls through n until at least one message arrives or d
// passes (then it returns nil). No answer and 503 are retried (failover);
// any other error fails the test. It returns the time the answer arrived.
func RtFetch(t *testing.T, n *tc.Node, topic, group string, d time.Duration, max, leaseMs int) ([]tc.Message, time.Time) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, time.Now()
		}
		wait := min(left, 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), wait+10*time.Second)
		msgs, _, err := n.Fetch(ctx, topic, group, tc.FetchRequest{Max: max, WaitMs: int(wait / time.Millisecond), LeaseMs: leaseMs})
		at := time.Now()
		cancel()
		if err != nil {
			if !tc.Retryable(err) {
				t.Fatalf("fetch %s/%s via %s: %v", topic, group, n, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if len(msgs) > 0 {
			return msgs, at
		}
	}
}

// RtFetchOne is RtFetch that wants exactly one message.
func RtFetchOne(t *testing.T, n *tc.Node, topic, group string, d time.Duration, leaseMs int) (tc.Message, time.Time) {
	t.Helper()
	msgs, at := RtFetch(t, n, topic, group, d, 1, leaseMs)
	if len(msgs) != 1 {
		t.Fatalf("fetch %s/%s via %s: %d messages within %v, want 1", topic, group, n, len(msgs), d)
	}
	return msgs[0], at
}

// RtNack nacks receipts through n and checks every result is ok; it returns
// when the request was sent and when its answer arrived.
func RtNack(t *testing.T, n *tc.Node, topic, group string, receipts []string, extra map[string]any) (sent, answered time.Time) {
	t.Helper()
	sent = time.Now()
	res, _, err := n.Nack(tc.CtxFor(t, 15*time.Second), topic, group, receipts, extra)
	answered = time.Now()
	if err != nil {
		t.Fatalf("nack %d receipts %v on %s/%s via %s: %v", len(receipts), extra, topic, group, n, err)
	}
	if len(res) != len(receipts) {
		t.Fatalf("nack: %d results for %d receipts", len(res), len(receipts))
	}
	for i, r := range res {
		if r.Status != "ok" || r.Receipt != receipts[i] {
			t.Fatalf("nack result %d: %+v, want status ok for receipt %q", i, r, receipts[i])
		}
	}
	return sent, answered
}

func RtReceipts(msgs []tc.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Receipt
	}
	return out
}

// RtPublishBatch publishes msgs in one atomic batch and returns the results.
func RtPublishBatch(t *testing.T, n *tc.Node, topic string, msgs []map[string]any) []tc.PublishResult {
	t.Helper()
	r, err := n.Do(tc.CtxFor(t, 15*time.Second), http.MethodPost, "/v1/topics/"+url.PathEscape(topic)+"/messages:batch",
		map[string]any{"messages": msgs}, nil)
	if err != nil {
		t.Fatalf("batch publish to %s: %v", topic, err)
	}
	if err := r.Expect(http.StatusOK); err != nil {
		t.Fatalf("batch publish to %s: %v", topic, err)
	}
	var ans struct {
		Results []tc.PublishResult `json:"results"`
	}
	if err := r.JSON(&ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Results) != len(msgs) {
		t.Fatalf("batch publish: %d results for %d messages", len(ans.Results), len(msgs))
	}
	return ans.Results
}

// RtFetchN leases exactly want messages (possibly over several fetches),
// bounded by d.
func RtFetchN(t *testing.T, n *tc.Node, topic, group string, want int, d time.Duration, leaseMs int) []tc.Message {
	t.Helper()
	deadline := time.Now().Add(d)
	var out []tc.Message
	for len(out) < want {
		msgs, _ := RtFetch(t, n, topic, group, time.Until(deadline), want-len(out), leaseMs)
		if len(msgs) == 0 {
			t.Fatalf("fetch %s/%s via %s: %d of %d messages within %v", topic, group, n, len(out), want, d)
		}
		out = append(out, msgs...)
	}
	return out
}

func MustValue(m tc.Message) []byte {
	v, err := m.Value()
	if err != nil {
		return []byte("<bad value_b64 " + m.ValueB64 + ">")
	}
	return v
}
