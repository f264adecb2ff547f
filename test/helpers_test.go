package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// ctxFor returns a context that ends after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// mustLeader waits (bounded) for the cluster's agreed leader.
func mustLeader(t testing.TB, c *tc.Cluster) *tc.Node {
	t.Helper()
	l, err := c.Leader(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatalf("leader: %v", err)
	}
	return l
}

// mustFollowers returns the leader and two followers of a healthy 3-node cluster.
func mustRoles(t testing.TB, c *tc.Cluster) (*tc.Node, []*tc.Node) {
	t.Helper()
	l := mustLeader(t, c)
	var fs []*tc.Node
	for _, n := range c.Live() {
		if n != l {
			fs = append(fs, n)
		}
	}
	if len(fs) == 0 {
		t.Fatalf("no follower")
	}
	return l, fs
}

func mustTopic(t testing.TB, n *tc.Node, topic string, cfg map[string]any) {
	t.Helper()
	if _, err := n.PutTopic(ctxFor(t, 15*time.Second), topic, cfg); err != nil {
		t.Fatalf("create topic %s via %s: %v", topic, n, err)
	}
}

func mustPublish(t testing.TB, n *tc.Node, topic, payload string, hdr map[string]string) tc.PublishResult {
	t.Helper()
	pr, _, err := n.Publish(ctxFor(t, 15*time.Second), topic, []byte(payload), hdr)
	if err != nil {
		t.Fatalf("publish %q to %s via %s: %v", payload, topic, n, err)
	}
	return pr
}

// retryable reports whether an error from a typed helper is worth retrying:
// no answer, or 503.
func retryable(err error) bool {
	var se *tc.StatusError
	if errors.As(err, &se) {
		return se.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// publishRetry publishes through the nodes in turn until one answers 2xx or
// ctx ends. It retries only after no answer or 503; since every retry may
// store the message again, use it only where duplicates do not matter.
func publishRetry(ctx context.Context, nodes []*tc.Node, topic, payload string) (tc.PublishResult, error) {
	var last error
	for i := 0; ; i++ {
		n := nodes[i%len(nodes)]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pr, _, err := n.Publish(rctx, topic, []byte(payload), map[string]string{"Mq-Timeout-Ms": "3000"})
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

// drain fetches and acks everything a group can get through n, until fetches
// have come back empty for idle. Transient errors are retried until ctx ends.
// It returns the delivered messages in delivery order.
func drain(ctx context.Context, n *tc.Node, topic, group string, idle time.Duration) ([]tc.Message, error) {
	var out []tc.Message
	lastSeen := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("drain %s/%s via %s: %w after %d messages", topic, group, n, err, len(out))
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msgs, _, err := n.Fetch(rctx, topic, group, tc.FetchRequest{Max: 100, WaitMs: 300, LeaseMs: 120000})
		cancel()
		if err != nil {
			if !retryable(err) {
				return out, err
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if len(msgs) == 0 {
			if time.Since(lastSeen) >= idle {
				return out, nil
			}
			continue
		}
		lastSeen = time.Now()
		out = append(out, msgs...)
		if err := ackAll(ctx, n, topic, group, msgs); err != nil {
			return out, err
		}
	}
}

// ackAll acks msgs, retrying transient failures, and checks every result is ok.
func ackAll(ctx context.Context, n *tc.Node, topic, group string, msgs []tc.Message) error {
	receipts := make([]string, len(msgs))
	for i, m := range msgs {
		receipts[i] = m.Receipt
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, _, err := n.Ack(rctx, topic, group, receipts)
		cancel()
		if err != nil {
			if !retryable(err) || ctx.Err() != nil {
				return fmt.Errorf("ack via %s: %w", n, err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if len(res) != len(receipts) {
			return fmt.Errorf("ack via %s: %d results for %d receipts", n, len(res), len(receipts))
		}
		for i, r := range res {
			if r.Status != "ok" {
				return fmt.Errorf("ack via %s: receipt %d (%s/%d@%d) status %q, want ok",
					n, i, msgs[i].Topic, msgs[i].Partition, msgs[i].Offset, r.Status)
			}
		}
		return nil
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
