package systest

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// PublishRetry publishes through the nodes in turn until one answers 2xx or
// ctx ends. It retries only after no answer or 503; since every retry may
// store the message again, use it only where duplicates do not matter.
func PublishRetry(ctx context.Context, nodes []*tc.Node, topic, payload string) (tc.PublishResult, error) {
	return publishRetryWith(ctx, nodes, topic, payload, map[string]string{"Mq-Timeout-Ms": "3000"})
}

// PublishKeyedRetry is PublishRetry with the payload as the publish's
// Idempotency-Key, so that a retry after an answer lost to a fault (a
// leader stepping down between commit and answer: 503, outcome unknown)
// stores the message once, as a client's retry must (SPEC section 13).
// For tests that count every acknowledged publish exactly once across
// faults; payloads must be unique within the topic.
func PublishKeyedRetry(ctx context.Context, nodes []*tc.Node, topic, payload string) (tc.PublishResult, error) {
	return publishRetryWith(ctx, nodes, topic, payload, map[string]string{"Mq-Timeout-Ms": "3000", "Idempotency-Key": payload})
}

func publishRetryWith(ctx context.Context, nodes []*tc.Node, topic, payload string, hdr map[string]string) (tc.PublishResult, error) {
	var last error
	for i := 0; ; i++ {
		n := nodes[i%len(nodes)]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pr, _, err := n.Publish(rctx, topic, []byte(payload), hdr)
		cancel()
		if err == nil {
			return pr, nil
		}
		last = err
		if !tc.Retryable(err) {
			return pr, err
		}
		select {
		case <-ctx.Done():
			return pr, fmt.Errorf("publish %q: %v (last error: %v)", payload, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Values decodes the payloads of msgs; it fails the test on a bad value_b64.
func Values(t testing.TB, msgs []tc.Message) []string {
	t.Helper()
	out := make([]string, len(msgs))
	for i, m := range msgs {
		v, err := m.Value()
		if err != nil {
			t.Fatalf("message %d@%d: value_b64 %q: %v", m.Partition, m.Offset, m.ValueB64, err)
		}
		out[i] = string(v)
	}
	return out
}

// PosKey identifies a stored message.
type PosKey struct {
	Partition int
	Offset    int64
}

// DistinctByPosition drops repeated deliveries of the same stored message.
func DistinctByPosition(msgs []tc.Message) []tc.Message {
	seen := map[PosKey]bool{}
	var out []tc.Message
	for _, m := range msgs {
		k := PosKey{m.Partition, m.Offset}
		if !seen[k] {
			seen[k] = true
			out = append(out, m)
		}
	}
	return out
}

// Sample lists up to 10 keys of a set, sorted, for failure messages.
func Sample(set map[string]bool) string {
	var ks []string
	for k := range set {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	if len(ks) > 10 {
		ks = append(ks[:10], "...")
	}
	return strings.Join(ks, ", ")
}

// PollStats polls topic stats through n until ok returns true or ctx ends;
// it returns the last stats seen.
func PollStats(ctx context.Context, n *tc.Node, topic string, ok func(tc.TopicStats) bool) (tc.TopicStats, error) {
	var last tc.TopicStats
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := n.Stats(rctx, topic)
		cancel()
		if err == nil {
			last = s
			if ok(s) {
				return s, nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("stats of %s via %s: condition not met: %v (last error %v; last stats %+v)", topic, n, ctx.Err(), lastErr, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// HandOffTo makes target the leader through a graceful stop of leader
// while other, which the caller paused, leaves target the only member it
// can hand off to: once leader sees other unreachable it gets SIGTERM;
// other resumes when target was elected, and leader's exit is awaited
// (within stop). The caller restarts leader.
func HandOffTo(ctx context.Context, t *testing.T, leader, target, other *tc.Node, stop time.Duration) {
	t.Helper()
	if _, err := tc.WaitView(ctx, leader, "the paused member unreachable", func(ci tc.ClusterInfo) bool {
		for _, x := range ci.Nodes {
			if x.ID == other.ID() {
				return x.State == "unreachable"
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	elected := func() int {
		b, _ := os.ReadFile(target.LogPath())
		return strings.Count(string(b), "became leader")
	}
	before := elected()
	if err := syscall.Kill(leader.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for elected() == before {
		if ctx.Err() != nil {
			t.Fatalf("%s was never elected", target)
		}
		time.Sleep(10 * time.Millisecond)
	}
	other.Resume()
	if _, err := leader.StopWithin(stop); err != nil {
		t.Errorf("graceful stop of the leader %s: %v", leader, err)
	}
}

// Pause sleeps for d or until ctx ends.
func Pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// CheckExactly fails unless got holds each wanted payload exactly once and nothing else.
func CheckExactly(t *testing.T, what string, got []string, want map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, v := range got {
		seen[v]++
	}
	missing, extra, dups := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for w := range want {
		if seen[w] == 0 {
			missing[w] = true
		}
	}
	for v, k := range seen {
		if !want[v] {
			extra[v] = true
		}
		if k > 1 {
			dups[v] = true
		}
	}
	if len(missing)+len(extra)+len(dups) > 0 {
		t.Errorf("%s: got %d messages for %d wanted; missing %d [%s]; unexpected %d [%s]; stored twice %d [%s]",
			what, len(got), len(want), len(missing), Sample(missing), len(extra), Sample(extra), len(dups), Sample(dups))
	}
}

// BrowsePage is the answer of GET /v1/topics/{topic}/messages.
type BrowsePage struct {
	Messages      []tc.Message `json:"messages"`
	NextPartition int          `json:"next_partition"`
	NextOffset    int64        `json:"next_offset"`
	More          bool         `json:"more"`
}
