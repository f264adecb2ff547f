package systest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// RollTraffic is the traffic a rolling upgrade runs under: publishers that
// give every message its own idempotency key and retry it through the
// next node on no answer or 503, as docs/operations.md tells clients to,
// and one consumer that fetches and acks the group rollGroup of every
// topic, through each node in turn. Each is bounded in count and by ctx.
// What they saw is kept for check: which publishes were acknowledged,
// which message each position holds, and which acks answered ok.
type RollTraffic struct {
	t     *testing.T
	nodes []*tc.Node
	ctx   context.Context
	stop  chan struct{}
	wg    sync.WaitGroup

	mu        sync.Mutex
	topics    []string                     // published to and consumed, in order of addition
	acked     map[string][]string          // topic → values whose publish was acknowledged
	results   map[string]tc.PublishResult  // value → its acknowledged publish's answer
	delivered map[string]map[PosKey]string // topic → position → value fetched there
	okAcks    map[string]map[PosKey]int    // topic → position → acks answered ok
	unsure    map[string]map[PosKey]bool   // an ack that had no answer, retried and answered stale
	retried   map[string]int               // publishes and acks sent again, by why (retryReason)
	failures  []string                     // what went wrong, reported by check
	progress  map[string]int               // topic → acks answered ok (for waitProgress)
}

const (
	rollGroup      = "workers"
	rollLeaseMs    = 20000 // a fetch whose answer is lost is redelivered after it
	rollPublishers = 2
	rollMaxEach    = 4000 // publishes per publisher, at most
)

// StartRollTraffic starts the publishers and the consumer on topics.
func StartRollTraffic(ctx context.Context, t *testing.T, nodes []*tc.Node, topics ...string) *RollTraffic {
	tr := &RollTraffic{t: t, nodes: nodes, ctx: ctx, stop: make(chan struct{}),
		acked: map[string][]string{}, results: map[string]tc.PublishResult{},
		delivered: map[string]map[PosKey]string{}, okAcks: map[string]map[PosKey]int{},
		unsure: map[string]map[PosKey]bool{}, progress: map[string]int{}, retried: map[string]int{}}
	tr.Add(topics...)
	for i := range rollPublishers {
		tr.wg.Add(1)
		go tr.publisher(i)
	}
	tr.wg.Add(1)
	go tr.consumer()
	return tr
}

// Add makes the traffic publish to and consume topics too.
func (tr *RollTraffic) Add(topics ...string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, tp := range topics {
		tr.topics = append(tr.topics, tp)
		tr.delivered[tp] = map[PosKey]string{}
		tr.okAcks[tp] = map[PosKey]int{}
		tr.unsure[tp] = map[PosKey]bool{}
	}
}

func (tr *RollTraffic) fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.failures) < 20 {
		tr.failures = append(tr.failures, fmt.Sprintf(format, args...))
	}
}

func (tr *RollTraffic) stopped() bool {
	select {
	case <-tr.stop:
		return true
	default:
		return tr.ctx.Err() != nil
	}
}

// Pause waits d, or less when the traffic stops.
func (tr *RollTraffic) pause(d time.Duration) {
	select {
	case <-tr.stop:
	case <-tr.ctx.Done():
	case <-time.After(d):
	}
}

func (tr *RollTraffic) topicList() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.topics)
}

// publisher i publishes to the topics in turn, each message through the
// next node, until stopped or rollMaxEach.
func (tr *RollTraffic) publisher(i int) {
	defer tr.wg.Done()
	for k := 0; k < rollMaxEach && !tr.stopped(); k++ {
		topics := tr.topicList()
		tp := topics[k%len(topics)]
		v := fmt.Sprintf("%s.p%d.%05d", tp, i, k)
		pr, err := tr.publish(tp, v, i+k)
		if err != nil {
			tr.fail("publish %s: %v", v, err)
			return
		}
		tr.mu.Lock()
		tr.acked[tp] = append(tr.acked[tp], v)
		tr.results[v] = pr
		tr.mu.Unlock()
		tr.pause(15 * time.Millisecond)
	}
}

// publish sends value v to tp with v as its idempotency key, through
// nodes[start%3] and then the next ones after no answer or a 503, with the
// same key, until one answers.
func (tr *RollTraffic) publish(tp, v string, start int) (tc.PublishResult, error) {
	hdr := map[string]string{"Idempotency-Key": v, "Mq-Timeout-Ms": "3000"}
	for try := 0; ; try++ {
		n := tr.nodes[(start+try)%len(tr.nodes)]
		rctx, cancel := context.WithTimeout(tr.ctx, 5*time.Second)
		pr, _, err := n.Publish(rctx, tp, []byte(v), hdr)
		cancel()
		switch {
		case err == nil && pr.Topic != tp:
			return pr, fmt.Errorf("via %s: answered topic %q", n, pr.Topic)
		case err == nil:
			return pr, nil
		case !tc.Retryable(err) || tr.ctx.Err() != nil:
			return pr, fmt.Errorf("via %s (try %d): %w", n, try+1, err)
		}
		tr.mu.Lock()
		tr.retried[RetryReason(err)]++
		tr.mu.Unlock()
		select {
		case <-tr.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consumer fetches from the topics in turn, through each node in turn,
// and acks what it got, until stopped.
func (tr *RollTraffic) consumer() {
	defer tr.wg.Done()
	for k := 0; !tr.stopped(); k++ {
		topics := tr.topicList()
		if !tr.consumeOnce(topics[k%len(topics)], k) {
			tr.pause(100 * time.Millisecond)
		}
	}
}

// consumeOnce fetches once from tp through nodes[k%3] and acks what came;
// false when the fetch had no answer (or a 503).
func (tr *RollTraffic) consumeOnce(tp string, k int) bool {
	n := tr.nodes[k%len(tr.nodes)]
	rctx, cancel := context.WithTimeout(tr.ctx, 8*time.Second)
	msgs, _, err := n.Fetch(rctx, tp, rollGroup, tc.FetchRequest{Max: 50, WaitMs: 100, LeaseMs: rollLeaseMs})
	cancel()
	if err != nil {
		if !tc.Retryable(err) && tr.ctx.Err() == nil {
			tr.fail("fetch %s via %s: %v", tp, n, err)
		}
		return false
	}
	tr.mu.Lock()
	for _, m := range msgs {
		v, err := m.Value()
		p := PosKey{m.Partition, m.Offset}
		if old, ok := tr.delivered[tp][p]; err != nil || ok && old != string(v) {
			tr.fail("%s %d@%d delivered %q, before %q (%v)", tp, m.Partition, m.Offset, v, old, err)
		}
		tr.delivered[tp][p] = string(v)
	}
	tr.mu.Unlock()
	if len(msgs) > 0 {
		tr.ack(tp, msgs, k)
	}
	return true
}

// ack acks msgs through nodes[start%3], then the next ones after no
// answer or a 503. A retried ack may answer stale when the first one was
// applied: such a position is unsure, and check counts it by the group's
// stats.
func (tr *RollTraffic) ack(tp string, msgs []tc.Message, start int) {
	receipts := RtReceipts(msgs)
	for try := 0; ; try++ {
		n := tr.nodes[(start+try)%len(tr.nodes)]
		rctx, cancel := context.WithTimeout(tr.ctx, 8*time.Second)
		res, _, err := n.Ack(rctx, tp, rollGroup, receipts)
		cancel()
		if err != nil {
			if !tc.Retryable(err) || tr.ctx.Err() != nil {
				tr.fail("ack %d receipts of %s via %s: %v", len(receipts), tp, n, err)
				return
			}
			tr.mu.Lock()
			tr.retried[RetryReason(err)]++
			tr.mu.Unlock()
			tr.pause(100 * time.Millisecond)
			continue
		}
		if len(res) != len(msgs) {
			tr.fail("ack of %s via %s: %d results for %d receipts", tp, n, len(res), len(msgs))
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for i, r := range res {
			p := PosKey{msgs[i].Partition, msgs[i].Offset}
			switch {
			case r.Status == "ok":
				tr.okAcks[tp][p]++
				tr.progress[tp]++
			case r.Status == "stale" && try > 0:
				tr.unsure[tp][p] = true
			default:
				tr.failures = append(tr.failures, fmt.Sprintf("ack of %s %d@%d via %s (try %d): %q", tp, p.Partition, p.Offset, n, try+1, r.Status))
			}
		}
		return
	}
}

// WaitProgress waits until each of topics has at least want publishes
// acknowledged and want messages acked since the call, or fails the test.
func (tr *RollTraffic) WaitProgress(what string, want int, topics ...string) {
	tr.t.Helper()
	base := func() (pub, acks map[string]int) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		pub, acks = map[string]int{}, map[string]int{}
		for _, tp := range topics {
			pub[tp], acks[tp] = len(tr.acked[tp]), tr.progress[tp]
		}
		return pub, acks
	}
	pub0, acks0 := base()
	deadline := time.Now().Add(45 * time.Second)
	for {
		pub, acks := base()
		done := true
		for _, tp := range topics {
			done = done && pub[tp]-pub0[tp] >= want && acks[tp]-acks0[tp] >= want
		}
		if done {
			return
		}
		tr.mu.Lock()
		failures := slices.Clone(tr.failures)
		tr.mu.Unlock()
		if len(failures) > 0 || time.Now().After(deadline) || tr.ctx.Err() != nil {
			tr.t.Fatalf("traffic %s: publishes acknowledged %v (from %v), acks %v (from %v), want %d more each; failures: %v",
				what, pub, pub0, acks, acks0, want, failures)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Finish stops the publishers and the consumer and waits for them.
func (tr *RollTraffic) Finish() {
	tr.t.Helper()
	close(tr.stop)
	tr.wg.Wait()
	if len(tr.failures) > 0 {
		tr.t.Fatalf("traffic: %d failures, first: %v", len(tr.failures), tr.failures)
	}
}

// Check consumes, through n, what is left of every topic in the group and
// checks that each acknowledged publish is stored once, each stored
// message was acknowledged, and each was acked exactly once: one ack
// answered ok per position (or an unsure one), and the group's stats
// count them all acked with nothing in flight or waiting.
func (tr *RollTraffic) Check(ctx context.Context, n *tc.Node) {
	t := tr.t
	t.Helper()
	for _, tp := range tr.topicList() {
		tr.drainRest(ctx, n, tp)
		byValue := map[string][]PosKey{}
		for p, v := range tr.delivered[tp] {
			byValue[v] = append(byValue[v], p)
		}
		var missing, twice, stranger, ackedTwice, never []string
		for _, v := range tr.acked[tp] {
			switch ps := byValue[v]; len(ps) {
			case 0:
				missing = append(missing, v)
			case 1:
			default:
				twice = append(twice, fmt.Sprintf("%s at %v", v, ps))
			}
		}
		want := map[string]bool{}
		for _, v := range tr.acked[tp] {
			want[v] = true
		}
		for p, v := range tr.delivered[tp] {
			at := fmt.Sprintf("%s %d@%d", v, p.Partition, p.Offset)
			if !want[v] {
				stranger = append(stranger, at)
			}
			switch k := tr.okAcks[tp][p]; {
			case k > 1:
				ackedTwice = append(ackedTwice, at)
			case k == 0 && !tr.unsure[tp][p]:
				never = append(never, at)
			}
		}
		for _, l := range [][]string{missing, twice, stranger, ackedTwice, never} {
			sort.Strings(l)
		}
		if len(missing)+len(twice)+len(stranger)+len(ackedTwice)+len(never) > 0 {
			t.Errorf("topic %s, %d publishes acknowledged: never delivered %d %v; stored twice %v; stored but never acknowledged %v; acked ok twice %v; never acked %v",
				tp, len(tr.acked[tp]), len(missing), head(missing), head(twice), head(stranger), head(ackedTwice), head(never))
		}
		st, ok, err := RtStats(ctx, n, tp, rollGroup)
		if err != nil || !ok || st.Acked != int64(len(tr.delivered[tp])) || st.InFlight != 0 || st.Backlog != 0 || st.Delayed != 0 || st.DLQ != 0 {
			t.Errorf("topic %s: group %s stats %+v (found %v, %v), want acked %d and nothing left", tp, rollGroup, st, ok, err, len(tr.delivered[tp]))
		}
	}
}

// drainRest fetches and acks tp's group through n until its stats show
// nothing waiting or in flight (a lease whose fetch answer was lost
// expires after rollLeaseMs and is delivered again).
func (tr *RollTraffic) drainRest(ctx context.Context, n *tc.Node, tp string) {
	t := tr.t
	t.Helper()
	for k := 0; ; k++ {
		tr.consumeOnce(tp, k)
		if len(tr.failures) > 0 {
			t.Fatalf("draining %s: %v", tp, tr.failures)
		}
		st, ok, err := RtStats(ctx, n, tp, rollGroup)
		if err == nil && ok && st.Backlog == 0 && st.InFlight == 0 && st.Delayed == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("draining %s: stats %+v (found %v, %v)", tp, st, ok, err)
		}
	}
}

// head is at most the first 5 of l, for messages.
func head(l []string) []string { return l[:min(5, len(l))] }

// SomeResults answers up to k acknowledged publishes to tp (value, which
// is also its key → the answer).
func (tr *RollTraffic) SomeResults(tp string, k int) map[string]tc.PublishResult {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[string]tc.PublishResult{}
	for _, v := range tr.acked[tp][:min(k, len(tr.acked[tp]))] {
		out[v] = tr.results[v]
	}
	return out
}

// Summary says how much traffic ran.
func (tr *RollTraffic) Summary() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	for _, tp := range tr.topics {
		fmt.Fprintf(&b, "%s %d published %d acked; ", tp, len(tr.acked[tp]), tr.progress[tp])
	}
	fmt.Fprintf(&b, "requests sent again: %v", tr.retried)
	return b.String()
}

// RetryReason classes an error a request is sent again after: no answer,
// or a 503's code (and for unavailable, whether the forward's connection
// was closed before the answer).
func RetryReason(err error) string {
	var se *tc.StatusError
	switch {
	case !errors.As(err, &se):
		return "no answer"
	case se.Code == "unavailable" && strings.Contains(se.Body, "closed the connection"):
		return "503 unavailable (connection closed)"
	}
	return fmt.Sprint(se.Status, " ", se.Code)
}
