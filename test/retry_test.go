package test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// System tests for retry with backoff, delayed delivery and dead letters
// (SPEC sections 4, 5 and 6), through HTTP on real three-node clusters.
//
// Timing: the broker notices a message that became due with a polling
// granularity of up to ~100 ms, and other clusters may share this machine,
// so a gap expected to be D is checked against [D-20ms, hi(D)]. The lower
// bound is measured from when the request that set the due time was *sent*
// (the broker takes its clock before committing, so a correct broker can
// never deliver earlier than that); the upper bound from when its answer
// arrived.

// ---- clusters ----

// TestRetry runs the retry/backoff/delay scenarios in parallel on one shared
// three-node cluster; each subtest uses topics of its own.
func TestRetry(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	t.Run("BackoffGaps", func(t *testing.T) { t.Parallel(); testRetryBackoffGaps(t, c) })
	t.Run("BackoffCap", func(t *testing.T) { t.Parallel(); testRetryBackoffCap(t, c) })
	t.Run("PerMessagePolicy", func(t *testing.T) { t.Parallel(); testRetryPerMessagePolicy(t, c) })
	t.Run("JitterBounds", func(t *testing.T) { t.Parallel(); testRetryJitter(t, c) })
	t.Run("MaxRetryToDLQ", func(t *testing.T) { t.Parallel(); testRetryMaxRetryToDLQ(t, c) })
	t.Run("NonRetryableNack", func(t *testing.T) { t.Parallel(); testRetryNonRetryable(t, c) })
	t.Run("LeaseExpiryCounts", func(t *testing.T) { t.Parallel(); testRetryLeaseExpiry(t, c) })
	t.Run("NoHOLDelayedPublish", func(t *testing.T) { t.Parallel(); testRetryNoHOLDelayed(t, c) })
	t.Run("NoHOLBackoff", func(t *testing.T) { t.Parallel(); testRetryNoHOLBackoff(t, c) })
	t.Run("NoHOLPoison", func(t *testing.T) { t.Parallel(); testRetryNoHOLPoison(t, c) })
}

// TestDLQ runs the dead-letter scenarios that need no node failure on one
// shared cluster.
func TestDLQ(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	t.Run("ReplayRate", func(t *testing.T) { t.Parallel(); testDLQReplayRate(t, c) })
	t.Run("ReplayKeepsGroupIdempotency", func(t *testing.T) { t.Parallel(); testDLQReplayIdempotency(t, c) })
	t.Run("DeleteAndPaging", func(t *testing.T) { t.Parallel(); testDLQDeleteAndPaging(t, c) })
}

// TestRetryFailover runs the two destructive scenarios one after the other
// on one cluster: a pending retry and a running replay each survive a
// SIGKILL of the leader.
func TestRetryFailover(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	if !t.Run("RetrySurvivesLeaderKill", func(t *testing.T) { testRetrySurvivesLeaderKill(t, c) }) {
		return
	}
	t.Run("DLQReplaySurvivesLeaderKill", func(t *testing.T) { testDLQReplaySurvivesLeaderKill(t, c) })
}

// ---- helpers ----

// rtWaitStats polls a group's stats until cond holds (bounded by d) and
// returns the last stats; it fails the test when cond never held.
func rtWaitStats(t *testing.T, n *tc.Node, topic, group string, d time.Duration, what string, cond func(tc.GroupStats) bool) tc.GroupStats {
	t.Helper()
	deadline := time.Now().Add(d)
	var last tc.GroupStats
	var lastErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, ok, err := systest.RtStats(ctx, n, topic, group)
		cancel()
		lastErr = err
		if err == nil && ok {
			last = s
			if cond(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s via %s: stats never met %q within %v; last %+v (last error %v)", topic, group, n, what, d, last, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rtReplay is POST .../dlq/replay; it returns the answer's "accepted".
func rtReplay(t *testing.T, n *tc.Node, topic, group string, body map[string]any) int {
	t.Helper()
	r, err := n.Do(tc.CtxFor(t, 15*time.Second), http.MethodPost, systest.RtGroupPath(topic, group)+"/dlq/replay", body, nil)
	if err != nil {
		t.Fatalf("replay %v on %s/%s via %s: %v", body, topic, group, n, err)
	}
	if err := r.Expect(http.StatusOK); err != nil {
		t.Fatalf("replay %v on %s/%s: %v", body, topic, group, err)
	}
	var ans struct {
		Accepted *int `json:"accepted"`
	}
	if err := r.JSON(&ans); err != nil || ans.Accepted == nil {
		t.Fatalf("replay answer %s: no \"accepted\" (%v)", r.Body, err)
	}
	return *ans.Accepted
}

// rtExpectNothing fails if a fetch with wait_ms d delivers anything.
func rtExpectNothing(t *testing.T, n *tc.Node, topic, group string, d time.Duration, why string) {
	t.Helper()
	msgs, _, err := n.Fetch(tc.CtxFor(t, d+10*time.Second), topic, group, tc.FetchRequest{Max: 10, WaitMs: int(d / time.Millisecond)})
	if err != nil {
		t.Fatalf("fetch %s/%s via %s: %v", topic, group, n, err)
	}
	if len(msgs) > 0 {
		t.Errorf("%s: fetch delivered %d messages, want none: first %d@%d value %q retry_count %d",
			why, len(msgs), msgs[0].Partition, msgs[0].Offset, systest.Values(t, msgs[:1])[0], msgs[0].RetryCount)
	}
}

func rtMustAck(t *testing.T, n *tc.Node, topic, group string, msgs []tc.Message) {
	t.Helper()
	if err := tc.AckAll(tc.CtxFor(t, 15*time.Second), n, topic, group, msgs); err != nil {
		t.Fatal(err)
	}
}

// rtHi is the upper tolerance for a gap expected to be d.
func rtHi(d time.Duration) time.Duration {
	switch {
	case d <= 250*time.Millisecond:
		return d + 250*time.Millisecond
	case d <= 500*time.Millisecond:
		return d + 300*time.Millisecond
	default:
		return d + d/2
	}
}

// rtCheckGap checks a gap expected to be want: sinceSent (from the request
// that set the due time being sent) must be >= want-20ms, sinceAnswer (from
// its answer) <= hi.
func rtCheckGap(t *testing.T, what string, want, hi, sinceSent, sinceAnswer time.Duration) {
	t.Helper()
	if lo := want - 20*time.Millisecond; sinceSent < lo {
		t.Errorf("%s: delivered %v after the request was sent, want >= %v (expected %v): too early", what, sinceSent.Round(time.Millisecond), lo, want)
	}
	if sinceAnswer > hi {
		t.Errorf("%s: delivered %v after the answer, want <= %v (expected %v): too late", what, sinceAnswer.Round(time.Millisecond), hi, want)
	}
}

func rtParseTime(t *testing.T, what, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Errorf("%s %q: not RFC 3339: %v", what, s, err)
	}
	return ts
}

// rtCheckLetter checks the fields every dead letter must carry against the
// published message and the expected history kinds and reasons (reasons nil:
// not checked).
func rtCheckLetter(t *testing.T, c *tc.Cluster, l systest.RtDeadLetter, pr tc.PublishResult, payload, key string, retryCount int, kinds, reasons []string) {
	t.Helper()
	if l.ID == 0 {
		t.Errorf("dead letter id 0: %+v", l)
	}
	if l.Partition != pr.Partition || l.Offset != pr.Offset || l.Value() != payload || l.IdempotencyKey != key {
		t.Errorf("dead letter %d: partition %d offset %d value %q key %q; want %d@%d %q key %q",
			l.ID, l.Partition, l.Offset, l.Value(), l.IdempotencyKey, pr.Partition, pr.Offset, payload, key)
	}
	if l.RetryCount != retryCount {
		t.Errorf("dead letter %d: retry_count %d, want %d", l.ID, l.RetryCount, retryCount)
	}
	if len(l.History) != len(kinds) {
		t.Fatalf("dead letter %d: %d history entries, want %d: %+v", l.ID, len(l.History), len(kinds), l.History)
	}
	pub := rtParseTime(t, "published_at", l.PublishedAt)
	dead := rtParseTime(t, "dead_at", l.DeadAt)
	prev := pub
	for i, h := range l.History {
		if h.Kind != kinds[i] {
			t.Errorf("dead letter %d history[%d].kind %q, want %q", l.ID, i, h.Kind, kinds[i])
		}
		if reasons != nil && h.Reason != reasons[i] {
			t.Errorf("dead letter %d history[%d].reason %q, want %q", l.ID, i, h.Reason, reasons[i])
		}
		if c.NodeByID(h.Node) == nil {
			t.Errorf("dead letter %d history[%d].node %q is not a node id of the cluster", l.ID, i, h.Node)
		}
		at := rtParseTime(t, fmt.Sprintf("history[%d].at", i), h.At)
		if at.Before(prev) {
			t.Errorf("dead letter %d history[%d].at %s before the previous event %s", l.ID, i, h.At, prev.Format(time.RFC3339Nano))
		}
		prev = at
	}
	if dead.Before(prev) {
		t.Errorf("dead letter %d: dead_at %s before its last failure %s", l.ID, l.DeadAt, prev.Format(time.RFC3339Nano))
	}
	if len(l.History) > 0 {
		last := l.History[len(l.History)-1]
		if l.RejectReason != last.Reason {
			t.Errorf("dead letter %d: reject_reason %q, want the last failure's reason %q", l.ID, l.RejectReason, last.Reason)
		}
	}
	if d := time.Since(dead); d < -time.Minute || d > 5*time.Minute {
		t.Errorf("dead letter %d: dead_at %s is not recent", l.ID, l.DeadAt)
	}
}

// ---- 1. backoff gaps ----

// A message nacked three times comes back after ~200, ~400, ~800 ms
// (base 200, no jitter), with retry_count 1, 2, 3 and reject_reason the
// previous nack's reason.
func testRetryBackoffGaps(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-backoff", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"backoff_base_ms": 200, "backoff_jitter_ms": 0, "backoff_max_ms": 10000, "max_retry": 5})
	pr := tc.MustPublish(t, fs[0], topic, "backoff me", nil)
	m, _ := systest.RtFetchOne(t, fs[1%len(fs)], topic, group, 5*time.Second, 30000)
	if m.RetryCount != 0 || m.RejectReason != "" || m.Offset != pr.Offset || m.MaxRetry != 5 {
		t.Fatalf("first delivery: %d@%d retry_count %d reject_reason %q max_retry %d; want %d@%d retry_count 0, no reason, max_retry 5",
			m.Partition, m.Offset, m.RetryCount, m.RejectReason, m.MaxRetry, pr.Partition, pr.Offset)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	var gaps []time.Duration
	for i, w := range want {
		reason := fmt.Sprintf("attempt %d failed", i+1)
		sent, answered := systest.RtNack(t, fs[0], topic, group, []string{m.Receipt}, map[string]any{"reason": reason})
		next, at := systest.RtFetchOne(t, fs[1%len(fs)], topic, group, w+5*time.Second, 30000)
		gap := at.Sub(answered)
		gaps = append(gaps, gap)
		t.Logf("retry %d: redelivered %v after the nack answer (%v after it was sent); expected %v",
			i+1, gap.Round(time.Millisecond), at.Sub(sent).Round(time.Millisecond), w)
		rtCheckGap(t, fmt.Sprintf("retry %d", i+1), w, rtHi(w), at.Sub(sent), gap)
		if next.Partition != pr.Partition || next.Offset != pr.Offset {
			t.Fatalf("retry %d delivered %d@%d, want the nacked %d@%d", i+1, next.Partition, next.Offset, pr.Partition, pr.Offset)
		}
		if next.RetryCount != i+1 {
			t.Errorf("retry %d: retry_count %d, want %d", i+1, next.RetryCount, i+1)
		}
		if next.RejectReason != reason {
			t.Errorf("retry %d: reject_reason %q, want the previous nack's reason %q", i+1, next.RejectReason, reason)
		}
		if next.Receipt == m.Receipt {
			t.Errorf("retry %d reused the previous delivery's receipt", i+1)
		}
		m = next
	}
	for i := 1; i < len(gaps); i++ {
		if gaps[i] <= gaps[i-1] {
			t.Errorf("backoff gaps not growing: %v", gaps)
			break
		}
	}
	rtMustAck(t, fs[0], topic, group, []tc.Message{m})
	rtExpectNothing(t, leader, topic, group, 300*time.Millisecond, "after the ack")
}

// backoff_max_ms caps the doubling: base 200, max 300 gives 200, 300, 300.
func testRetryBackoffCap(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-backoff-cap", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"backoff_base_ms": 200, "backoff_jitter_ms": 0, "backoff_max_ms": 300, "max_retry": 5})
	tc.MustPublish(t, fs[0], topic, "capped", nil)
	m, _ := systest.RtFetchOne(t, leader, topic, group, 5*time.Second, 30000)
	for i, w := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond} {
		sent, answered := systest.RtNack(t, leader, topic, group, []string{m.Receipt}, map[string]any{"reason": "again"})
		next, at := systest.RtFetchOne(t, leader, topic, group, w+5*time.Second, 30000)
		t.Logf("retry %d: redelivered %v after the nack answer; expected %v", i+1, at.Sub(answered).Round(time.Millisecond), w)
		rtCheckGap(t, fmt.Sprintf("capped retry %d", i+1), w, rtHi(w), at.Sub(sent), at.Sub(answered))
		if next.RetryCount != i+1 {
			t.Errorf("retry %d: retry_count %d", i+1, next.RetryCount)
		}
		m = next
	}
	rtMustAck(t, leader, topic, group, []tc.Message{m})
}

// Mq-Max-Retry, Mq-Backoff-Base-Ms and Mq-Backoff-Jitter-Ms override the
// topic's policy for one message.
func testRetryPerMessagePolicy(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-per-message", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"max_retry": 5, "backoff_base_ms": 5000, "backoff_jitter_ms": 1000})
	pr := tc.MustPublish(t, fs[0], topic, "own policy", map[string]string{
		"Mq-Max-Retry": "1", "Mq-Backoff-Base-Ms": "150", "Mq-Backoff-Jitter-Ms": "0"})
	m, _ := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 30000)
	if m.MaxRetry != 1 {
		t.Errorf("delivery max_retry %d, want the message's Mq-Max-Retry 1", m.MaxRetry)
	}
	sent, answered := systest.RtNack(t, fs[0], topic, group, []string{m.Receipt}, map[string]any{"reason": "first"})
	m2, at := systest.RtFetchOne(t, fs[0], topic, group, 8*time.Second, 30000)
	t.Logf("redelivered %v after the nack answer (message backoff 150 ms; topic's would be 5000-6000 ms)", at.Sub(answered).Round(time.Millisecond))
	rtCheckGap(t, "per-message backoff 150 ms", 150*time.Millisecond, rtHi(150*time.Millisecond), at.Sub(sent), at.Sub(answered))
	if m2.RetryCount != 1 || m2.MaxRetry != 1 {
		t.Errorf("redelivery retry_count %d max_retry %d, want 1 and 1", m2.RetryCount, m2.MaxRetry)
	}
	systest.RtNack(t, fs[0], topic, group, []string{m2.Receipt}, map[string]any{"reason": "second"})
	letters := systest.RtWaitDLQ(t, fs[0], topic, group, 1, 5*time.Second)
	rtCheckLetter(t, c, letters[0], pr, "own policy", "", 2, []string{"nack", "nack"}, []string{"first", "second"})
	rtExpectNothing(t, fs[0], topic, group, 500*time.Millisecond, "after the message's own max_retry 1 was exhausted")
}

// ---- 2. jitter ----

// base 100, jitter 300: the first retry of each of 10 messages nacked at
// once comes within [100, 400+tolerance] ms, and the gaps are not all
// equal (the jitter is drawn per message).
func testRetryJitter(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group, n = "retry-jitter", "g", 10
	tc.MustTopic(t, leader, topic, map[string]any{"backoff_base_ms": 100, "backoff_jitter_ms": 300, "backoff_max_ms": 10000, "max_retry": 5})
	var batch []map[string]any
	for i := range n {
		batch = append(batch, map[string]any{"value": fmt.Sprintf("j-%02d", i)})
	}
	systest.RtPublishBatch(t, fs[0], topic, batch)
	first := systest.RtFetchN(t, fs[0], topic, group, n, 5*time.Second, 30000)
	sent, answered := systest.RtNack(t, fs[0], topic, group, systest.RtReceipts(first), map[string]any{"reason": "jitter"})
	arrived := map[systest.PosKey]time.Time{}
	deadline := time.Now().Add(5 * time.Second)
	for len(arrived) < n && time.Now().Before(deadline) {
		msgs, at := systest.RtFetch(t, fs[0], topic, group, time.Until(deadline), n, 30000)
		for _, m := range msgs {
			k := systest.PosKey{Partition: m.Partition, Offset: m.Offset}
			if _, dup := arrived[k]; dup {
				t.Errorf("message %d@%d delivered twice after one nack", m.Partition, m.Offset)
			}
			arrived[k] = at
			if m.RetryCount != 1 || m.RejectReason != "jitter" {
				t.Errorf("redelivery of %d@%d: retry_count %d reject_reason %q, want 1 and %q", m.Partition, m.Offset, m.RetryCount, m.RejectReason, "jitter")
			}
		}
		if len(msgs) > 0 {
			rtMustAck(t, fs[0], topic, group, msgs)
		}
	}
	if len(arrived) != n {
		t.Fatalf("%d of %d nacked messages redelivered within 5 s (backoff 100 + jitter <= 300 ms)", len(arrived), n)
	}
	var gaps []time.Duration
	for _, at := range arrived {
		gaps = append(gaps, at.Sub(answered))
		rtCheckGap(t, "first retry with jitter", 100*time.Millisecond, 700*time.Millisecond, at.Sub(sent), at.Sub(answered))
	}
	slices.Sort(gaps)
	t.Logf("first-retry gaps after the nack answer (base 100, jitter 300): %v", gaps)
	if spread := gaps[len(gaps)-1] - gaps[0]; spread < 50*time.Millisecond {
		t.Errorf("first-retry gaps of %d messages all within %v of each other (%v): jitter of 300 ms not drawn per message?", n, spread, gaps)
	}
}

// ---- 3. max_retry exhaustion ----

// max_retry 2: the third nack sends the message to the DLQ with
// retry_count 3, the last reason, and three "nack" history entries.
func testRetryMaxRetryToDLQ(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-exhaust", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"max_retry": 2, "backoff_base_ms": 50, "backoff_jitter_ms": 0})
	pr := tc.MustPublish(t, fs[0], topic, "doomed", map[string]string{"Idempotency-Key": "exhaust-1", "Mq-Attr-Origin": "retry-test"})
	reasons := []string{"timeout talking to db", "db still down", "giving up"}
	nodes := c.Nodes()
	for i, reason := range reasons {
		m, _ := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 30000)
		if m.Offset != pr.Offset || m.RetryCount != i {
			t.Fatalf("delivery %d: %d@%d retry_count %d, want %d@%d retry_count %d", i, m.Partition, m.Offset, m.RetryCount, pr.Partition, pr.Offset, i)
		}
		// Nack through each node in turn.
		systest.RtNack(t, nodes[i%len(nodes)], topic, group, []string{m.Receipt}, map[string]any{"reason": reason})
	}
	letters := systest.RtWaitDLQ(t, fs[0], topic, group, 1, 5*time.Second)
	l := letters[0]
	rtCheckLetter(t, c, l, pr, "doomed", "exhaust-1", 3, []string{"nack", "nack", "nack"}, reasons)
	if l.RejectReason != "giving up" {
		t.Errorf("dead letter reject_reason %q, want the last nack's %q", l.RejectReason, "giving up")
	}
	if l.Attrs["origin"] != "retry-test" {
		t.Errorf("dead letter attrs %v, want origin=retry-test", l.Attrs)
	}
	for i, h := range l.History {
		t.Logf("history[%d]: %+v (nacked via %s)", i, h, nodes[i%len(nodes)].ID())
	}
	s := rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 1", func(s tc.GroupStats) bool { return s.DLQ == 1 })
	if s.InFlight != 0 || s.Backlog != 0 || s.Delayed != 0 || s.Acked != 0 {
		t.Errorf("stats after the message went to the DLQ: %+v; want in_flight, backlog, delayed, acked 0", s)
	}
	rtExpectNothing(t, fs[0], topic, group, time.Second, "after max_retry exhaustion")
}

// ---- 4. non-retryable nack ----

func testRetryNonRetryable(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-reject", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"max_retry": 5, "backoff_base_ms": 50, "backoff_jitter_ms": 0})
	pr := tc.MustPublish(t, fs[0], topic, "malformed order", map[string]string{"Idempotency-Key": "reject-1"})
	m, _ := systest.RtFetchOne(t, fs[1%len(fs)], topic, group, 5*time.Second, 30000)
	systest.RtNack(t, fs[1%len(fs)], topic, group, []string{m.Receipt}, map[string]any{"reason": "schema violation", "retryable": false})
	letters := systest.RtWaitDLQ(t, leader, topic, group, 1, 5*time.Second)
	rtCheckLetter(t, c, letters[0], pr, "malformed order", "reject-1", 1, []string{"rejected"}, []string{"schema violation"})
	rtWaitStats(t, fs[0], topic, group, 5*time.Second, "dlq == 1, in_flight == 0", func(s tc.GroupStats) bool { return s.DLQ == 1 && s.InFlight == 0 })
	rtExpectNothing(t, fs[0], topic, group, time.Second, "after a non-retryable nack")
	// The receipt is spent.
	res, _, err := fs[0].Ack(tc.CtxFor(t, 10*time.Second), topic, group, []string{m.Receipt})
	if err != nil || len(res) != 1 || res[0].Status != "stale" {
		t.Errorf("ack of the rejected delivery's receipt: %+v %v; want stale", res, err)
	}
}

// ---- 5. lease expiry ----

// lease_ms 300, never acked, base 100, max_retry 1: two expiries send the
// message to the DLQ with two "lease_expired" history entries.
func testRetryLeaseExpiry(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "retry-lease", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"max_retry": 1, "backoff_base_ms": 100, "backoff_jitter_ms": 0})
	pr := tc.MustPublish(t, fs[0], topic, "slow consumer", nil)
	m1, at1 := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 300)
	if m1.RetryCount != 0 {
		t.Errorf("first delivery retry_count %d, want 0", m1.RetryCount)
	}
	m2, at2 := systest.RtFetchOne(t, fs[1%len(fs)], topic, group, 5*time.Second, 300)
	t.Logf("redelivered %v after the first fetch answered (lease 300 + backoff 100); reject_reason %q", at2.Sub(at1).Round(time.Millisecond), m2.RejectReason)
	if m2.Offset != pr.Offset || m2.RetryCount != 1 {
		t.Errorf("after the lease expired: %d@%d retry_count %d, want %d@%d retry_count 1", m2.Partition, m2.Offset, m2.RetryCount, pr.Partition, pr.Offset)
	}
	// The lease was taken before the fetch answered: 400 ms is a strict floor
	// from the previous answer minus the time the fetch took to commit, so
	// allow for that.
	if gap := at2.Sub(at1); gap < 350*time.Millisecond {
		t.Errorf("redelivered %v after the first fetch, before lease (300 ms) + backoff (100 ms) could pass", gap)
	}
	letters := systest.RtWaitDLQ(t, leader, topic, group, 1, 5*time.Second)
	rtCheckLetter(t, c, letters[0], pr, "slow consumer", "", 2, []string{"lease_expired", "lease_expired"}, nil)
	t.Logf("dead letter after two expiries: reject_reason %q history %+v", letters[0].RejectReason, letters[0].History)
	res, _, err := fs[0].Ack(tc.CtxFor(t, 10*time.Second), topic, group, []string{m1.Receipt, m2.Receipt})
	if err != nil || len(res) != 2 || res[0].Status != "stale" || res[1].Status != "stale" {
		t.Errorf("ack of both expired receipts: %+v %v; want stale, stale", res, err)
	}
	rtWaitStats(t, fs[0], topic, group, 5*time.Second, "dlq == 1, nothing in flight", func(s tc.GroupStats) bool {
		return s.DLQ == 1 && s.InFlight == 0 && s.Backlog == 0 && s.Delayed == 0
	})
	rtExpectNothing(t, fs[0], topic, group, 500*time.Millisecond, "after the lease expiries exhausted max_retry")
}

// ---- 6. no head-of-line blocking ----

// A delayed message (Mq-Delay-Ms 3000) does not hold back the five
// published after it in its partition; it arrives about 3 s after its publish.
func testRetryNoHOLDelayed(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "hol-delay", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 1})
	sent := time.Now()
	delayed := tc.MustPublish(t, fs[0], topic, "later", map[string]string{"Mq-Delay-Ms": "3000"})
	answered := time.Now()
	for i := range 5 {
		tc.MustPublish(t, fs[0], topic, fmt.Sprintf("now-%d", i), nil)
	}
	start := time.Now()
	var got []tc.Message
	for len(got) < 5 && time.Since(start) < 1500*time.Millisecond {
		msgs, _ := systest.RtFetch(t, fs[1%len(fs)], topic, group, 1500*time.Millisecond-time.Since(start), 10, 30000)
		got = append(got, msgs...)
	}
	took := time.Since(start)
	vals := systest.Values(t, got)
	if slices.Contains(vals, "later") {
		t.Fatalf("delayed message delivered %v after its publish, before its 3 s delay: %v", time.Since(sent), vals)
	}
	if len(got) != 5 {
		t.Fatalf("the 5 messages behind a delayed one: got %v within %v, want all 5 at once", vals, took)
	}
	t.Logf("5 messages behind the delayed one delivered within %v", took.Round(time.Millisecond))
	rtMustAck(t, fs[1%len(fs)], topic, group, got)
	s, ok, err := systest.RtStats(tc.CtxFor(t, 5*time.Second), leader, topic, group)
	if err != nil || !ok {
		t.Fatalf("stats: %v %v", ok, err)
	}
	if time.Since(sent) < 2500*time.Millisecond && (s.Delayed != 1 || s.Backlog != 0 || s.InFlight != 0) {
		t.Errorf("stats while the delayed message waits: %+v; want delayed 1, backlog 0, in_flight 0", s)
	}
	m, at := systest.RtFetchOne(t, fs[0], topic, group, 6*time.Second, 30000)
	if m.Offset != delayed.Offset || systest.Values(t, []tc.Message{m})[0] != "later" {
		t.Fatalf("after the delay: got %d@%d, want the delayed message at offset %d", m.Partition, m.Offset, delayed.Offset)
	}
	t.Logf("delayed message (3000 ms) delivered %v after its publish was answered", at.Sub(answered).Round(time.Millisecond))
	rtCheckGap(t, "Mq-Delay-Ms 3000", 3000*time.Millisecond, 3700*time.Millisecond, at.Sub(sent), at.Sub(answered))
	if m.RetryCount != 0 {
		t.Errorf("delayed message retry_count %d, want 0", m.RetryCount)
	}
	rtMustAck(t, fs[0], topic, group, []tc.Message{m})
}

// A message waiting out a nack's delay_ms 3000 does not hold back later
// messages of its partition; it returns after about 3 s.
func testRetryNoHOLBackoff(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "hol-backoff", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 1, "backoff_base_ms": 100, "backoff_jitter_ms": 0})
	a := tc.MustPublish(t, fs[0], topic, "A", nil)
	m, _ := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 30000)
	if m.Offset != a.Offset {
		t.Fatalf("first fetch: offset %d, want %d", m.Offset, a.Offset)
	}
	sent, answered := systest.RtNack(t, fs[0], topic, group, []string{m.Receipt}, map[string]any{"reason": "later please", "delay_ms": 3000})
	tc.MustPublish(t, fs[1%len(fs)], topic, "B", nil)
	tc.MustPublish(t, fs[1%len(fs)], topic, "C", nil)
	start := time.Now()
	var got []tc.Message
	for len(got) < 2 && time.Since(start) < 1500*time.Millisecond {
		msgs, _ := systest.RtFetch(t, fs[1%len(fs)], topic, group, 1500*time.Millisecond-time.Since(start), 10, 30000)
		got = append(got, msgs...)
	}
	vals := systest.Values(t, got)
	if slices.Contains(vals, "A") {
		t.Fatalf("A came back %v after a nack with delay_ms 3000: %v", time.Since(answered), vals)
	}
	if !slices.Equal(vals, []string{"B", "C"}) {
		t.Fatalf("messages behind A (waiting out delay_ms 3000): got %v within 1.5 s, want [B C]", vals)
	}
	rtMustAck(t, fs[1%len(fs)], topic, group, got)
	if st, ok, err := systest.RtStats(tc.CtxFor(t, 5*time.Second), leader, topic, group); err != nil || !ok {
		t.Errorf("stats: %v %v", ok, err)
	} else if time.Since(answered) < 2500*time.Millisecond && (st.Delayed != 1 || st.Backlog != 0 || st.InFlight != 0) {
		t.Errorf("stats while A waits out its delay: %+v; want delayed 1, backlog 0, in_flight 0", st)
	}
	back, at := systest.RtFetchOne(t, fs[0], topic, group, 6*time.Second, 30000)
	t.Logf("A redelivered %v after the nack answer (delay_ms 3000)", at.Sub(answered).Round(time.Millisecond))
	if back.Offset != a.Offset || back.RetryCount != 1 || back.RejectReason != "later please" {
		t.Errorf("redelivery: offset %d retry_count %d reject_reason %q; want %d, 1, %q", back.Offset, back.RetryCount, back.RejectReason, a.Offset, "later please")
	}
	rtCheckGap(t, "nack delay_ms 3000", 3000*time.Millisecond, 3700*time.Millisecond, at.Sub(sent), at.Sub(answered))
	rtMustAck(t, fs[0], topic, group, []tc.Message{back})
}

// A poison message (always nacked) at the head of a partition does not
// stall it: the ten behind it are all consumed and acked while it cycles
// through its retries into the DLQ.
func testRetryNoHOLPoison(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group, n = "hol-poison", "g", 10
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 1, "max_retry": 3, "backoff_base_ms": 300, "backoff_jitter_ms": 0})
	poison := tc.MustPublish(t, fs[0], topic, "poison", nil)
	var batch []map[string]any
	for i := range n {
		batch = append(batch, map[string]any{"value": fmt.Sprintf("good-%02d", i)})
	}
	systest.RtPublishBatch(t, fs[0], topic, batch)

	acked := map[string]int{}
	var poisonRetries []int
	var lastGoodAck time.Time
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && (len(acked) < n || len(poisonRetries) < 4) {
		msgs, _ := systest.RtFetch(t, fs[1%len(fs)], topic, group, min(time.Until(deadline), 3*time.Second), 1, 30000)
		if len(msgs) == 0 {
			break
		}
		m := msgs[0]
		switch v := systest.Values(t, msgs)[0]; v {
		case "poison":
			poisonRetries = append(poisonRetries, m.RetryCount)
			systest.RtNack(t, fs[1%len(fs)], topic, group, []string{m.Receipt}, map[string]any{"reason": "cannot parse"})
		default:
			rtMustAck(t, fs[1%len(fs)], topic, group, msgs)
			acked[v]++
			lastGoodAck = time.Now()
		}
	}
	if len(acked) != n {
		t.Fatalf("only %d of %d good messages behind a poison message consumed within 15 s: %v", len(acked), n, acked)
	}
	for v, k := range acked {
		if k != 1 {
			t.Errorf("good message %s delivered %d times", v, k)
		}
	}
	if !slices.Equal(poisonRetries, []int{0, 1, 2, 3}) {
		t.Errorf("poison message delivered with retry_counts %v, want [0 1 2 3] (max_retry 3)", poisonRetries)
	}
	letters := systest.RtWaitDLQ(t, leader, topic, group, 1, 5*time.Second)
	l := letters[0]
	rtCheckLetter(t, c, l, poison, "poison", "", 4, []string{"nack", "nack", "nack", "nack"},
		[]string{"cannot parse", "cannot parse", "cannot parse", "cannot parse"})
	dead := rtParseTime(t, "dead_at", l.DeadAt)
	t.Logf("last good message acked %v before the poison message was dead-lettered", dead.Sub(lastGoodAck).Round(time.Millisecond))
	if !lastGoodAck.Before(dead) {
		t.Errorf("the good messages were acked only at %s, after the poison message reached the DLQ at %s: the partition stalled behind it",
			lastGoodAck.Format(time.RFC3339Nano), l.DeadAt)
	}
	rtExpectNothing(t, fs[0], topic, group, 500*time.Millisecond, "after the poison message went to the DLQ")
}

// ---- 7. a pending retry survives a leader kill ----

func testRetrySurvivesLeaderKill(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	via := fs[0]
	const topic, group = "failover-retry", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"backoff_base_ms": 3000, "backoff_jitter_ms": 0, "max_retry": 5})
	pr := tc.MustPublish(t, via, topic, "survive", nil)
	m, _ := systest.RtFetchOne(t, via, topic, group, 5*time.Second, 30000)
	sent, answered := systest.RtNack(t, via, topic, group, []string{m.Receipt}, map[string]any{"reason": "before the crash"})
	leader.Kill()
	killed := time.Since(answered)
	// The retry cannot be handed out before there is a leader again: an
	// election with split votes takes seconds on a loaded machine.
	elected := make(chan time.Time, 1)
	go func() {
		if _, err := c.Leader(tc.CtxFor(t, 15*time.Second)); err == nil {
			elected <- time.Now()
		}
		close(elected)
	}()
	back, at := systest.RtFetchOne(t, via, topic, group, 15*time.Second, 30000)
	nl := tc.MustLeader(t, c)
	electedAt, ok := <-elected
	if !ok {
		t.Fatalf("no leader agreed within 15 s of killing %s", leader)
	}
	t.Logf("leader %s killed %v after the nack answer; new leader %s agreed %v after it; retry (backoff 3000 ms) delivered via %s %v after the nack answer",
		leader, killed.Round(time.Millisecond), nl, electedAt.Sub(answered).Round(time.Millisecond), via, at.Sub(answered).Round(time.Millisecond))
	if nl == leader {
		t.Fatalf("killed node %s still named leader", leader)
	}
	if back.Offset != pr.Offset || back.RetryCount != 1 || back.RejectReason != "before the crash" {
		t.Errorf("after failover: %d@%d retry_count %d reject_reason %q; want %d@%d, 1, %q",
			back.Partition, back.Offset, back.RetryCount, back.RejectReason, pr.Partition, pr.Offset, "before the crash")
	}
	// Due 3 s after the nack; late by at most 3 s after that or after the
	// new leader, whichever is later.
	rtCheckGap(t, "retry across a leader kill", 3000*time.Millisecond,
		max(3*time.Second, electedAt.Sub(answered))+3*time.Second, at.Sub(sent), at.Sub(answered))
	rtMustAck(t, via, topic, group, []tc.Message{back})

	// Bring the killed node back for the next scenario.
	leader.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("cluster not ready after restarting %s: %v", leader, err)
	}
}

// ---- 8. replay rate ----

// 30 rejected messages replayed at 10/s take about 3 s to come back; the
// DLQ and replay_pending shrink to 0; replayed messages have retry_count 0
// and keep their idempotency key.
func testDLQReplayRate(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group, n = "dlq-replay-rate", "g", 30
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	var batch []map[string]any
	for i := range n {
		batch = append(batch, map[string]any{"value": fmt.Sprintf("rr-%02d", i), "idempotency_key": fmt.Sprintf("rk-%02d", i)})
	}
	systest.RtPublishBatch(t, fs[0], topic, batch)
	first := systest.RtFetchN(t, fs[0], topic, group, n, 5*time.Second, 30000)
	systest.RtNack(t, fs[0], topic, group, systest.RtReceipts(first), map[string]any{"reason": "reject all", "retryable": false})
	rtWaitStats(t, fs[0], topic, group, 5*time.Second, "dlq == 30", func(s tc.GroupStats) bool { return s.DLQ == n && s.InFlight == 0 })

	accepted := rtReplay(t, fs[1%len(fs)], topic, group, map[string]any{"all": true, "rate_per_sec": 10})
	start := time.Now()
	if accepted != n {
		t.Fatalf("replay all: accepted %d, want %d", accepted, n)
	}
	arrived := map[string]time.Time{}
	var statsSeen []tc.GroupStats
	deadline := start.Add(10 * time.Second)
	for len(arrived) < n && time.Now().Before(deadline) {
		msgs, at := systest.RtFetch(t, fs[0], topic, group, min(time.Until(deadline), 500*time.Millisecond), n, 30000)
		for _, m := range msgs {
			v := systest.Values(t, []tc.Message{m})[0]
			if _, dup := arrived[v]; dup {
				t.Errorf("replayed message %s delivered twice", v)
			}
			arrived[v] = at
			if want := "rk-" + strings.TrimPrefix(v, "rr-"); m.IdempotencyKey != want {
				t.Errorf("replayed %s: idempotency_key %q, want %q", v, m.IdempotencyKey, want)
			}
			if m.RetryCount != 0 {
				t.Errorf("replayed %s: retry_count %d, want 0 (reset by the replay)", v, m.RetryCount)
			}
		}
		if len(msgs) > 0 {
			rtMustAck(t, fs[0], topic, group, msgs)
		}
		if s, ok, err := systest.RtStats(tc.CtxFor(t, 5*time.Second), leader, topic, group); err == nil && ok {
			statsSeen = append(statsSeen, s)
		}
	}
	if len(arrived) != n {
		t.Fatalf("%d of %d replayed messages delivered within 10 s at rate 10/s", len(arrived), n)
	}
	var last time.Duration
	perSec := map[int]int{}
	for _, at := range arrived {
		d := at.Sub(start)
		last = max(last, d)
		perSec[int(d/time.Second)]++
	}
	var secs []string
	for s := 0; s <= int(last/time.Second); s++ {
		secs = append(secs, fmt.Sprintf("%ds:%d", s, perSec[s]))
	}
	t.Logf("replay of %d at 10/s: last arrived %v after the replay answer; per second %v", n, last.Round(time.Millisecond), secs)
	if last < 2500*time.Millisecond {
		t.Errorf("all %d replayed at rate_per_sec 10 arrived within %v, want >= 2.5 s", n, last)
	}
	if last > 6*time.Second {
		t.Errorf("replay of %d at rate_per_sec 10 took %v, want <= 6 s", n, last)
	}
	for s, k := range perSec {
		if k > 16 {
			t.Errorf("%d replayed messages arrived in second %d, want about 10 (rate_per_sec 10)", k, s)
		}
	}
	for i := 1; i < len(statsSeen); i++ {
		if statsSeen[i].ReplayPending > statsSeen[i-1].ReplayPending || statsSeen[i].DLQ > statsSeen[i-1].DLQ {
			t.Errorf("dlq/replay_pending grew during the replay: %+v then %+v", statsSeen[i-1], statsSeen[i])
			break
		}
	}
	midway := false
	for _, s := range statsSeen {
		if s.ReplayPending > 0 && s.ReplayPending < n && s.DLQ > 0 && s.DLQ < n {
			midway = true
		}
	}
	if !midway {
		t.Errorf("no stats sample during the ~3 s replay showed 0 < replay_pending, dlq < %d: %+v", n, statsSeen)
	}
	s := rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 0 and replay_pending == 0", func(s tc.GroupStats) bool {
		return s.DLQ == 0 && s.ReplayPending == 0
	})
	if s.InFlight != 0 || s.Backlog != 0 || s.Acked != n {
		t.Errorf("stats after the replay was consumed: %+v; want in_flight 0, backlog 0, acked %d", s, n)
	}
	if p := systest.RtMustListDLQ(t, fs[0], topic, group, ""); len(p.DeadLetters) != 0 {
		t.Errorf("GET dlq after the replay: %d letters left", len(p.DeadLetters))
	}
}

// ---- 9. a replay survives a leader kill ----

func testDLQReplaySurvivesLeaderKill(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	via := fs[0]
	const topic, group, n = "failover-replay", "g", 40
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2, "backoff_base_ms": 100, "backoff_jitter_ms": 0, "max_retry": 10})
	var batch []map[string]any
	for i := range n {
		batch = append(batch, map[string]any{"value": fmt.Sprintf("fr-%02d", i)})
	}
	systest.RtPublishBatch(t, via, topic, batch)
	first := systest.RtFetchN(t, via, topic, group, n, 5*time.Second, 30000)
	systest.RtNack(t, via, topic, group, systest.RtReceipts(first), map[string]any{"reason": "bury", "retryable": false})
	rtWaitStats(t, via, topic, group, 5*time.Second, "dlq == 40", func(s tc.GroupStats) bool { return s.DLQ == n })
	if got := rtReplay(t, via, topic, group, map[string]any{"all": true, "rate_per_sec": 8}); got != n {
		t.Fatalf("replay all: accepted %d, want %d", got, n)
	}
	start := time.Now()

	// Consume through the follower that survives, with short leases so that a
	// delivery lost with the leader comes back soon.
	type delivery struct {
		value string
		retry int
		at    time.Duration
	}
	var (
		mu         sync.Mutex
		deliveries []delivery
		ackedOK    = map[string]time.Duration{}
		ackUnknown = map[string]bool{} // an ack sent, its outcome unknown (the leader died answering it)
		afterAck   []string
		consumeErr error
	)
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			msgs, _, err := via.Fetch(ctx, topic, group, tc.FetchRequest{Max: 10, WaitMs: 500, LeaseMs: 3000})
			cancel()
			if err != nil {
				if !tc.Retryable(err) {
					mu.Lock()
					consumeErr = err
					mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if len(msgs) == 0 {
				continue
			}
			mu.Lock()
			for _, m := range msgs {
				v := string(systest.MustValue(m))
				deliveries = append(deliveries, delivery{v, m.RetryCount, time.Since(start)})
				if _, ok := ackedOK[v]; ok {
					afterAck = append(afterAck, fmt.Sprintf("%s (retry_count %d)", v, m.RetryCount))
				}
			}
			mu.Unlock()
			ctx, cancel = context.WithTimeout(context.Background(), 8*time.Second)
			res, _, err := via.Ack(ctx, topic, group, systest.RtReceipts(msgs))
			cancel()
			if err != nil || len(res) != len(msgs) {
				// Unknown outcome: if the ack was lost the lease expires and
				// the message comes back; if it committed, the group has it.
				mu.Lock()
				for _, m := range msgs {
					ackUnknown[string(systest.MustValue(m))] = true
				}
				mu.Unlock()
				continue
			}
			mu.Lock()
			for i, r := range res {
				if r.Status == "ok" {
					ackedOK[string(systest.MustValue(msgs[i]))] = time.Since(start)
				}
			}
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-done:
		default:
			close(stop)
			<-done
		}
	}()

	time.Sleep(time.Second)
	mu.Lock()
	before := len(deliveries)
	mu.Unlock()
	leader.Kill()
	t.Logf("killed leader %s %v after the replay answer, %d replayed messages delivered by then", leader, time.Since(start).Round(time.Millisecond), before)

	// unsettled lists the messages not acked ok whose ack outcome is not
	// unknown either: those must still come back.
	unsettled := func() (notOK, open []string) {
		for i := range n {
			v := fmt.Sprintf("fr-%02d", i)
			if ackedOK[v] == 0 {
				notOK = append(notOK, v)
				if !ackUnknown[v] {
					open = append(open, v)
				}
			}
		}
		return notOK, open
	}
	// groupDone: the group's own account, on every live node, is that all n
	// were acked and nothing is left.
	groupDone := func() (bool, string) {
		var views []string
		all := true
		for _, x := range c.Live() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, _, err := systest.RtStats(sctx, x, topic, group)
			cancel()
			views = append(views, fmt.Sprintf("%s: %+v (%v)", x, st, err))
			all = all && err == nil && st.Acked == n && st.InFlight == 0 && st.Backlog == 0 && st.DLQ == 0 && st.ReplayPending == 0
		}
		return all, strings.Join(views, "; ")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		notOK, open := unsettled()
		err := consumeErr
		mu.Unlock()
		if err != nil {
			t.Fatalf("consumer via %s: %v", via, err)
		}
		if len(notOK) == 0 || time.Now().After(deadline) {
			break
		}
		if len(open) == 0 {
			if ok, _ := groupDone(); ok {
				break // the acks of unknown outcome committed
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Give a wrongly repeated replay step a moment to show up.
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	nl := tc.MustLeader(t, c)
	t.Logf("new leader %s; %d deliveries, %d acked ok, last ack %v after the replay answer", nl, len(deliveries), len(ackedOK), maxDur(ackedOK).Round(time.Millisecond))
	notOK, open := unsettled()
	settled, views := groupDone()
	for wait := time.Now().Add(5 * time.Second); len(notOK) > 0 && !settled && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond) // a follower applying the last acks
		settled, views = groupDone()
	}
	if len(notOK) > 0 {
		t.Logf("acks of unknown outcome (sent as the leader died) for %v; the group's account: %s", notOK, views)
	}
	if len(open) > 0 || (len(notOK) > 0 && !settled) {
		t.Errorf("%d of %d replayed messages consumed and acked ok within 30 s of the kill; not acked ok %v, of which with no ack sent %v; the group's account: %s",
			len(ackedOK), n, notOK, open, views)
		// Where the missing ones are: every node's view of the group and
		// its dead letters, and each delivery.
		for _, x := range c.Live() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, _, err := systest.RtStats(sctx, x, topic, group)
			p, derr := systest.RtListDLQ(sctx, x, topic, group, "")
			cancel()
			var dead []string
			for _, d := range p.DeadLetters {
				dead = append(dead, d.Value())
			}
			t.Logf("%s: stats %+v (%v); dead letters %v (%v)", x, st, err, dead, derr)
		}
		for _, d := range deliveries {
			t.Logf("delivered %s retry_count %d at %v, acked ok at %v", d.value, d.retry, d.at.Round(time.Millisecond), ackedOK[d.value].Round(time.Millisecond))
		}
	}
	if len(afterAck) > 0 {
		t.Errorf("delivered again after the group acked them (replayed twice?): %v", afterAck)
	}
	count := map[string][]int{}
	for _, d := range deliveries {
		count[d.value] = append(count[d.value], d.retry)
	}
	for v, rs := range count {
		zeros := 0
		for _, r := range rs {
			if r == 0 {
				zeros++
			}
		}
		if zeros > 1 {
			t.Errorf("%s delivered %d times with retry_count 0 (put back twice by the replay): %v", v, zeros, rs)
		} else if len(rs) > 1 {
			t.Logf("%s delivered %d times (retry_counts %v): a lease lost in the failover expired", v, len(rs), rs)
		}
	}
	s := rtWaitStats(t, via, topic, group, 10*time.Second, "dlq == 0 and replay_pending == 0", func(s tc.GroupStats) bool {
		return s.DLQ == 0 && s.ReplayPending == 0
	})
	if s.Acked != n {
		t.Errorf("stats after the replay: %+v; want acked %d", s, n)
	}
	leader.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Errorf("cluster not ready after restarting %s: %v", leader, err)
	}
}

func maxDur(m map[string]time.Duration) time.Duration {
	var d time.Duration
	for _, v := range m {
		d = max(d, v)
	}
	return d
}

// ---- 10. replay and consumer-group idempotency ----

// A message with key K is rejected into the DLQ; a later message with K
// (published after the publish dedup window) is acked by the group; the
// replayed dead K must not be delivered to that group again.
func testDLQReplayIdempotency(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group, key = "dlq-idem", "g", "order-4711"
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 1500})
	first := tc.MustPublish(t, fs[0], topic, "first", map[string]string{"Idempotency-Key": key})
	m, _ := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 30000)
	if m.Offset != first.Offset || m.IdempotencyKey != key {
		t.Fatalf("first delivery %d@%d key %q, want %d@%d key %q", m.Partition, m.Offset, m.IdempotencyKey, first.Partition, first.Offset, key)
	}
	systest.RtNack(t, fs[0], topic, group, []string{m.Receipt}, map[string]any{"reason": "downstream refused", "retryable": false})
	letters := systest.RtWaitDLQ(t, fs[0], topic, group, 1, 5*time.Second)
	deadID := letters[0].ID

	// Keys recorded from now on keep a long window (for the group's ack of K).
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 600000})
	// Publish K again until the first publish's 1.5 s window has passed.
	var second tc.PublishResult
	deadline := time.Now().Add(8 * time.Second)
	for {
		second = tc.MustPublish(t, fs[1%len(fs)], topic, "second", map[string]string{"Idempotency-Key": key})
		if !second.Duplicate {
			break
		}
		if second.Offset != first.Offset || second.Partition != first.Partition {
			t.Fatalf("duplicate publish of %q answered %d@%d, want the original %d@%d", key, second.Partition, second.Offset, first.Partition, first.Offset)
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish of key %q still a duplicate 8 s after the first (dedup_window_ms 1500)", key)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m2, _ := systest.RtFetchOne(t, fs[0], topic, group, 5*time.Second, 30000)
	if m2.Offset != second.Offset || systest.Values(t, []tc.Message{m2})[0] != "second" {
		t.Fatalf("second delivery %d@%d %q, want %d@%d \"second\"", m2.Partition, m2.Offset, systest.Values(t, []tc.Message{m2})[0], second.Partition, second.Offset)
	}
	rtMustAck(t, fs[0], topic, group, []tc.Message{m2})
	before := rtWaitStats(t, fs[0], topic, group, 5*time.Second, "acked == 1", func(s tc.GroupStats) bool { return s.Acked == 1 && s.DLQ == 1 })

	if got := rtReplay(t, fs[1%len(fs)], topic, group, map[string]any{"ids": []uint64{deadID}}); got != 1 {
		t.Fatalf("replay of dead letter %d: accepted %d, want 1", deadID, got)
	}
	// The replay is paced in the background: keep fetching for a while.
	rtExpectNothing(t, fs[0], topic, group, 2*time.Second, fmt.Sprintf("replay of a dead message with key %q the group has already processed", key))
	after := rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 0, replay_pending == 0, duplicates_skipped grew", func(s tc.GroupStats) bool {
		return s.DLQ == 0 && s.ReplayPending == 0 && s.DuplicatesSkipped > before.DuplicatesSkipped
	})
	t.Logf("stats before the replay %+v, after %+v", before, after)
	if after.DuplicatesSkipped != before.DuplicatesSkipped+1 || after.InFlight != 0 || after.Backlog != 0 {
		t.Errorf("after the replay: %+v; want duplicates_skipped %d, in_flight 0, backlog 0", after, before.DuplicatesSkipped+1)
	}
}

// ---- 11. delete and paging ----

func testDLQDeleteAndPaging(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic, group = "dlq-paging", "g"
	// Publish dedup off, so that several messages may carry one key.
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 1, "dedup_window_ms": 0})
	type spec struct{ value, key string }
	specs := []spec{{"p0", "kA"}, {"p1", "kB"}, {"p2", ""}, {"p3", "kA"}, {"p4", "kB"}, {"p5", "kA"}, {"p6", ""}}
	offsets := map[string]int64{}
	for _, s := range specs {
		hdr := map[string]string{}
		if s.key != "" {
			hdr["Idempotency-Key"] = s.key
		}
		pr := tc.MustPublish(t, fs[0], topic, s.value, hdr)
		if pr.Duplicate {
			t.Fatalf("publish %s with dedup_window_ms 0 answered duplicate", s.value)
		}
		offsets[s.value] = pr.Offset
	}
	// Reject each message as it comes (one leased message per key at a time).
	deadline := time.Now().Add(10 * time.Second)
	rejected := 0
	for rejected < len(specs) && time.Now().Before(deadline) {
		msgs, _ := systest.RtFetch(t, fs[0], topic, group, time.Until(deadline), 10, 30000)
		if len(msgs) == 0 {
			break
		}
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].Offset < msgs[j].Offset })
		systest.RtNack(t, fs[0], topic, group, systest.RtReceipts(msgs), map[string]any{"reason": "bad", "retryable": false})
		rejected += len(msgs)
	}
	if rejected != len(specs) {
		t.Fatalf("rejected %d of %d messages within 10 s", rejected, len(specs))
	}
	all := systest.RtWaitDLQ(t, fs[1%len(fs)], topic, group, len(specs), 5*time.Second)
	byValue := map[string]systest.RtDeadLetter{}
	for i, l := range all {
		if i > 0 && l.ID <= all[i-1].ID {
			t.Errorf("dead letters not oldest first: id %d after %d", l.ID, all[i-1].ID)
		}
		byValue[l.Value()] = l
	}
	for _, s := range specs {
		l, ok := byValue[s.value]
		if !ok {
			t.Fatalf("dead letter for %s missing: %+v", s.value, all)
		}
		if l.IdempotencyKey != s.key || l.Offset != offsets[s.value] {
			t.Errorf("dead letter for %s: key %q offset %d, want %q %d", s.value, l.IdempotencyKey, l.Offset, s.key, offsets[s.value])
		}
	}

	// Paging with limit 3: 3, 3, 1.
	var paged []uint64
	after := uint64(0)
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatalf("paging did not end after 5 pages: %v", paged)
		}
		p := systest.RtMustListDLQ(t, fs[0], topic, group, fmt.Sprintf("limit=3&after=%d", after))
		if len(p.DeadLetters) > 3 {
			t.Fatalf("limit=3 answered %d letters", len(p.DeadLetters))
		}
		for _, l := range p.DeadLetters {
			if l.ID <= after {
				t.Errorf("page after=%d holds id %d", after, l.ID)
			}
			paged = append(paged, l.ID)
		}
		if len(p.DeadLetters) < 3 {
			if p.NextAfter != nil {
				t.Errorf("short page (%d letters) with next_after %d, want null", len(p.DeadLetters), *p.NextAfter)
			}
			break
		}
		if p.NextAfter == nil || *p.NextAfter != p.DeadLetters[2].ID {
			t.Fatalf("full page: next_after %v, want the last id %d", p.NextAfter, p.DeadLetters[2].ID)
		}
		after = *p.NextAfter
	}
	// A last page that is full: nothing follows, so next_after is null.
	if p := systest.RtMustListDLQ(t, fs[0], topic, group, fmt.Sprintf("limit=%d", len(all))); len(p.DeadLetters) != len(all) || p.NextAfter != nil {
		t.Errorf("limit=%d (every letter): %d letters, next_after %v; want all and null", len(all), len(p.DeadLetters), p.NextAfter)
	}
	var allIDs []uint64
	for _, l := range all {
		allIDs = append(allIDs, l.ID)
	}
	if !slices.Equal(paged, allIDs) {
		t.Errorf("paging with limit 3 gave ids %v, listing all gave %v", paged, allIDs)
	}

	// Filter by idempotency key.
	for key, want := range map[string][]string{"kA": {"p0", "p3", "p5"}, "kB": {"p1", "p4"}, "nope": nil} {
		p := systest.RtMustListDLQ(t, fs[0], topic, group, "idempotency_key="+url.QueryEscape(key))
		var got []string
		for _, l := range p.DeadLetters {
			got = append(got, l.Value())
			if l.IdempotencyKey != key {
				t.Errorf("filter idempotency_key=%s returned a letter with key %q", key, l.IdempotencyKey)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("filter idempotency_key=%s: got %v, want %v", key, got, want)
		}
		if p.NextAfter != nil {
			t.Errorf("filter idempotency_key=%s (default limit): next_after %d, want null", key, *p.NextAfter)
		}
	}
	p1 := systest.RtMustListDLQ(t, fs[0], topic, group, "idempotency_key=kA&limit=2")
	if len(p1.DeadLetters) != 2 || p1.NextAfter == nil {
		t.Fatalf("filter kA limit 2: %d letters next_after %v, want 2 and an id", len(p1.DeadLetters), p1.NextAfter)
	}
	p2 := systest.RtMustListDLQ(t, fs[0], topic, group, fmt.Sprintf("idempotency_key=kA&limit=2&after=%d", *p1.NextAfter))
	if len(p2.DeadLetters) != 1 || p2.DeadLetters[0].Value() != "p5" || p2.NextAfter != nil {
		t.Errorf("filter kA limit 2, second page: %+v, want p5 alone and next_after null", p2)
	}

	// DELETE one.
	victim := byValue["p3"]
	r, err := fs[1%len(fs)].Do(tc.CtxFor(t, 10*time.Second), http.MethodDelete, fmt.Sprintf("%s/dlq/%d", systest.RtGroupPath(topic, group), victim.ID), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Expect(http.StatusOK); err != nil {
		t.Fatalf("DELETE dlq/%d: %v", victim.ID, err)
	}
	left := systest.RtWaitDLQ(t, fs[0], topic, group, len(specs)-1, 5*time.Second)
	for _, l := range left {
		if l.ID == victim.ID {
			t.Errorf("deleted dead letter %d still listed", victim.ID)
		}
	}
	if p := systest.RtMustListDLQ(t, fs[0], topic, group, "idempotency_key=kA"); len(p.DeadLetters) != 2 {
		t.Errorf("filter kA after deleting p3: %d letters, want 2", len(p.DeadLetters))
	}
	rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 6", func(s tc.GroupStats) bool { return s.DLQ == int64(len(specs)-1) })
	for _, id := range []string{fmt.Sprint(victim.ID), "999999"} {
		r, err := fs[0].Do(tc.CtxFor(t, 10*time.Second), http.MethodDelete, systest.RtGroupPath(topic, group)+"/dlq/"+id, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		code, cerr := r.CheckError()
		if r.Status != http.StatusNotFound || code != "dead_letter_not_found" || cerr != nil {
			t.Errorf("DELETE dlq/%s (unknown): %d %s, want 404 dead_letter_not_found", id, r.Status, r.Body)
		}
	}
	if r, err := fs[0].Do(tc.CtxFor(t, 10*time.Second), http.MethodDelete, systest.RtGroupPath(topic, group)+"/dlq/abc", nil, nil); err != nil || r.Status != http.StatusBadRequest {
		t.Errorf("DELETE dlq/abc: %v %v, want 400", r, err)
	}

	// Bad replay and list requests change nothing.
	for _, body := range []string{`{}`, `{"all":false}`, `{"ids":[1],"all":true}`, `{"all":true,"rate_per_sec":0}`,
		`{"all":true,"rate_per_sec":-1}`, `{"all":true,"rate":5}`, `{"ids":[]}`, `{"ids":["1"]}`, `not json`} {
		r, err := fs[0].Do(tc.CtxFor(t, 10*time.Second), http.MethodPost, systest.RtGroupPath(topic, group)+"/dlq/replay", body,
			map[string]string{"Content-Type": "application/json"})
		if err != nil {
			t.Fatal(err)
		}
		if code, cerr := r.CheckError(); r.Status != http.StatusBadRequest || cerr != nil {
			t.Errorf("replay %s: %d %s (code %q), want 400 with a JSON error", body, r.Status, r.Body, code)
		}
	}
	for _, q := range []string{"limit=0", "limit=abc", "after=-1", "limit=1001"} {
		r, err := fs[0].Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, systest.RtGroupPath(topic, group)+"/dlq?"+q, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, cerr := r.CheckError(); r.Status != http.StatusBadRequest || cerr != nil {
			t.Errorf("GET dlq?%s: %d %s (code %q), want 400 with a JSON error", q, r.Status, r.Body, code)
		}
	}
	if got := rtReplay(t, fs[0], topic, group, map[string]any{"ids": []uint64{victim.ID, 999999}}); got != 0 {
		t.Errorf("replay of a deleted and an unknown id: accepted %d, want 0", got)
	}
	rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 6, replay_pending == 0", func(s tc.GroupStats) bool {
		return s.DLQ == int64(len(specs)-1) && s.ReplayPending == 0
	})

	// Replay all: the six left come back, the deleted one does not.
	if got := rtReplay(t, fs[0], topic, group, map[string]any{"all": true}); got != len(specs)-1 {
		t.Errorf("replay all after one delete: accepted %d, want %d", got, len(specs)-1)
	}
	msgs, err := tc.Drain(tc.CtxFor(t, 20*time.Second), fs[0], topic, group, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, s := range specs {
		if s.value != "p3" {
			want[s.value] = true
		}
	}
	systest.CheckExactly(t, "replay all after deleting p3", systest.Values(t, msgs), want)
	rtWaitStats(t, leader, topic, group, 5*time.Second, "dlq == 0, replay_pending == 0", func(s tc.GroupStats) bool { return s.DLQ == 0 && s.ReplayPending == 0 })
}
