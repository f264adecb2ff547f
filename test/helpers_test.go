package test

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

// The helpers every system-test package shares live in internal/testcluster
// (must.go); these names keep the tests of this package short.
var (
	ctxFor      = tc.CtxFor
	mustLeader  = tc.MustLeader
	mustRoles   = tc.MustRoles
	mustTopic   = tc.MustTopic
	mustPublish = tc.MustPublish
	retryable   = tc.Retryable
	drain       = tc.Drain
	ackAll      = tc.AckAll
)

// publishRetry publishes through the nodes in turn until one answers 2xx or
// ctx ends. It retries only after no answer or 503; since every retry may
// store the message again, use it only where duplicates do not matter.
func publishRetry(ctx context.Context, nodes []*tc.Node, topic, payload string) (tc.PublishResult, error) {
	return publishRetryWith(ctx, nodes, topic, payload, map[string]string{"Mq-Timeout-Ms": "3000"})
}

// publishKeyedRetry is publishRetry with the payload as the publish's
// Idempotency-Key, so that a retry after an answer lost to a fault (a
// leader stepping down between commit and answer: 503, outcome unknown)
// stores the message once, as a client's retry must (SPEC section 13).
// For tests that count every acknowledged publish exactly once across
// faults; payloads must be unique within the topic.
func publishKeyedRetry(ctx context.Context, nodes []*tc.Node, topic, payload string) (tc.PublishResult, error) {
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
		if !retryable(err) {
			return pr, err
		}
		select {
		case <-ctx.Done():
			return pr, fmt.Errorf("publish %q: %v (last error: %v)", payload, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// values decodes the payloads of msgs; it fails the test on a bad value_b64.
func values(t testing.TB, msgs []tc.Message) []string {
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

// posKey identifies a stored message.
type posKey struct {
	partition int
	offset    int64
}

// distinctByPosition drops repeated deliveries of the same stored message.
func distinctByPosition(msgs []tc.Message) []tc.Message {
	seen := map[posKey]bool{}
	var out []tc.Message
	for _, m := range msgs {
		k := posKey{m.Partition, m.Offset}
		if !seen[k] {
			seen[k] = true
			out = append(out, m)
		}
	}
	return out
}

// sample lists up to 10 keys of a set, sorted, for failure messages.
func sample(set map[string]bool) string {
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

// pollStats polls topic stats through n until ok returns true or ctx ends;
// it returns the last stats seen.
func pollStats(ctx context.Context, n *tc.Node, topic string, ok func(tc.TopicStats) bool) (tc.TopicStats, error) {
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

// handOffTo makes target the leader through a graceful stop of leader
// while other, which the caller paused, leaves target the only member it
// can hand off to: once leader sees other unreachable it gets SIGTERM;
// other resumes when target was elected, and leader's exit is awaited
// (within stop). The caller restarts leader.
func handOffTo(ctx context.Context, t *testing.T, leader, target, other *tc.Node, stop time.Duration) {
	t.Helper()
	if _, err := waitView(ctx, leader, "the paused member unreachable", func(ci tc.ClusterInfo) bool {
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
