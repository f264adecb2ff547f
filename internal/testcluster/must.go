package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// The helpers below are shared by every system-test package (test/,
// test/clients, test/console, test/chaos): bounded waits that fail the test
// with what was asked of which node.

// CtxFor returns a context that ends after d or with the test.
func CtxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// MustLeader waits (bounded) for the cluster's agreed leader.
func MustLeader(t testing.TB, c *Cluster) *Node {
	t.Helper()
	l, err := c.Leader(CtxFor(t, 30*time.Second))
	if err != nil {
		t.Fatalf("leader: %v", err)
	}
	return l
}

// MustRoles returns the leader and two followers of a healthy 3-node cluster.
func MustRoles(t testing.TB, c *Cluster) (*Node, []*Node) {
	t.Helper()
	l := MustLeader(t, c)
	var fs []*Node
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

func MustTopic(t testing.TB, n *Node, topic string, cfg map[string]any) {
	t.Helper()
	if _, err := n.PutTopic(CtxFor(t, 15*time.Second), topic, cfg); err != nil {
		t.Fatalf("create topic %s via %s: %v", topic, n, err)
	}
}

func MustPublish(t testing.TB, n *Node, topic, payload string, hdr map[string]string) PublishResult {
	t.Helper()
	pr, _, err := n.Publish(CtxFor(t, 15*time.Second), topic, []byte(payload), hdr)
	if err != nil {
		t.Fatalf("publish %q to %s via %s: %v", payload, topic, n, err)
	}
	return pr
}

// Retryable reports whether an error from a typed helper is worth retrying:
// no answer, or 503.
func Retryable(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status == http.StatusServiceUnavailable
	}
	return err != nil
}

// Drain fetches and acks everything a group can get through n, until fetches
// have come back empty for idle. Transient errors are retried until ctx ends.
// It returns the delivered messages in delivery order.
func Drain(ctx context.Context, n *Node, topic, group string, idle time.Duration) ([]Message, error) {
	var out []Message
	lastSeen := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("Drain %s/%s via %s: %w after %d messages", topic, group, n, err, len(out))
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msgs, _, err := n.Fetch(rctx, topic, group, FetchRequest{Max: 100, WaitMs: 300, LeaseMs: 120000})
		cancel()
		if err != nil {
			if !Retryable(err) {
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
		if err := AckAll(ctx, n, topic, group, msgs); err != nil {
			return out, err
		}
	}
}

// AckAll acks msgs, retrying transient failures, and checks every result is ok.
func AckAll(ctx context.Context, n *Node, topic, group string, msgs []Message) error {
	receipts := make([]string, len(msgs))
	for i, m := range msgs {
		receipts[i] = m.Receipt
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, _, err := n.Ack(rctx, topic, group, receipts)
		cancel()
		if err != nil {
			if !Retryable(err) || ctx.Err() != nil {
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
