package test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// System tests of the idempotency features (SPEC sections 4 and 5, docs/API.md):
// publish dedup by Idempotency-Key (racing, across a leader kill, window
// expiry, batches), producer sequences, consumer-group idempotency (acked
// key skipped, same key held while leased, across failover, DLQ replay), and
// the dedup index surviving snapshot install and a restart of every node.
//
// Two clusters: TestDedup runs the non-destructive scenarios in parallel on
// one; TestDedupFailover runs the scenarios that kill nodes one after the
// other on another (started with frequent snapshots).

func TestDedup(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	t.Run("RacingDuplicates", func(t *testing.T) { t.Parallel(); testDedupRacing(t, c) })
	t.Run("ProducerSequence", func(t *testing.T) { t.Parallel(); testDedupProducerSeq(t, c) })
	t.Run("BatchKeys", func(t *testing.T) { t.Parallel(); testDedupBatchKeys(t, c) })
	t.Run("WindowExpiry", func(t *testing.T) { t.Parallel(); testDedupWindowExpiry(t, c) })
	t.Run("GroupAckedKeySkipped", func(t *testing.T) { t.Parallel(); testDedupGroupAckedSkipped(t, c) })
	t.Run("GroupSameKeyHeld", func(t *testing.T) { t.Parallel(); testDedupGroupHeld(t, c) })
	t.Run("GroupDLQReplaySkipped", func(t *testing.T) { t.Parallel(); testDedupGroupDLQReplay(t, c) })
}

// A retry finds its original even after the topic's max_message_bytes was
// lowered below its size (by key, single and in a batch, and by producer
// sequence); a new message of that size is refused 413 (a client told
// 413 would take the stored original for never stored).
func TestDedupRepeatOverLoweredMax(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	leader := tc.MustLeader(t, c)
	ctx := tc.CtxFor(t, 30*time.Second)
	if _, err := tc.WaitView(ctx, leader, "state format 2 or later", func(ci tc.ClusterInfo) bool { return ci.StateFormat >= 2 }); err != nil {
		t.Fatal(err)
	}
	const topic = "dedup-lowered-max"
	tc.MustTopic(t, leader, topic, map[string]any{"max_message_bytes": 5})
	n := c.Live()[len(c.Live())-1]
	first := tc.MustPublish(t, n, topic, "abcd", map[string]string{"Idempotency-Key": "K"})
	prod := tc.MustPublish(t, n, topic, "efgh", map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "0"})
	tc.MustTopic(t, leader, topic, map[string]any{"max_message_bytes": 2})
	if again := tc.MustPublish(t, n, topic, "abcd", map[string]string{"Idempotency-Key": "K"}); !again.Duplicate || again.Offset != first.Offset || again.Partition != first.Partition {
		t.Errorf("repeat of K over the lowered max: %+v, want a duplicate of %+v", again, first)
	}
	if again := tc.MustPublish(t, n, topic, "efgh", map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "0"}); !again.Duplicate || again.Offset != prod.Offset {
		t.Errorf("repeat of producer seq 0 over the lowered max: %+v, want a duplicate of %+v", again, prod)
	}
	r, err := n.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/messages:batch", map[string]any{"messages": []map[string]any{{"value": "abcd", "idempotency_key": "K"}}}, nil)
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"duplicate":true`) {
		t.Errorf("batch repeat of K over the lowered max: %v %v, want 200 duplicate", r, err)
	}
	// New messages over the max are refused before raft: no command
	// goes through the group commit (the only writer here).
	commits := func() float64 {
		v, _ := systest.MetricValue(systest.Scrape(ctx, t, leader), "mqd_batch_commands", nil)
		return v
	}
	before := commits()
	for _, hdr := range []map[string]string{{"Idempotency-Key": "new"}, nil, {"Mq-Producer-Id": "p", "Mq-Producer-Seq": "1"}} {
		_, r, err := n.Publish(ctx, topic, []byte("abcd"), hdr)
		if code := ""; r != nil {
			code, _ = r.CheckError()
			if r.Status != http.StatusRequestEntityTooLarge || code != "message_too_large" {
				t.Errorf("new message over the lowered max (%v): %d %s, want 413 message_too_large", hdr, r.Status, r.Body)
			}
		} else {
			t.Errorf("new message over the lowered max (%v): %v", hdr, err)
		}
	}
	if after := commits(); after != before {
		t.Errorf("refused oversized publishes went through raft: %v group commits, was %v", after, before)
	}
	if s, err := n.Stats(ctx, topic); err != nil || s.NextOffsets() != 2 {
		t.Errorf("%s: %v messages (%v), want the 2 originals only", topic, s.NextOffsets(), err)
	}
}

func TestDedupFailover(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithSnapshot(100, time.Second, 50))
	// Sequential: each kills nodes and brings them back.
	t.Run("LeaderKillRetries", func(t *testing.T) { testDedupLeaderKill(t, c) })
	t.Run("GroupKeyAcrossFailover", func(t *testing.T) { testDedupGroupFailover(t, c) })
	t.Run("SnapshotRestore", func(t *testing.T) { testDedupSnapshot(t, c) })
}

// ---- helpers ----

// pubAnswer is the outcome of one publish request.
type pubAnswer struct {
	err    error // no answer (connection refused, timeout, ...)
	status int
	res    tc.PublishResult // for 200/201
	code   string           // error.code for other statuses
	hdr    http.Header
	body   string
}

func (a pubAnswer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, systest.Shorten(a.body))
}

// created reports a 201 with duplicate:false.
func (a pubAnswer) created() bool {
	return a.err == nil && a.status == http.StatusCreated && !a.res.Duplicate
}

// dup reports a 200 with duplicate:true.
func (a pubAnswer) dup() bool { return a.err == nil && a.status == http.StatusOK && a.res.Duplicate }

// stored reports either success answer.
func (a pubAnswer) stored() bool { return a.created() || a.dup() }

func place(r tc.PublishResult) string { return fmt.Sprintf("%d@%d", r.Partition, r.Offset) }

func samePlace(a, b tc.PublishResult) bool { return a.Partition == b.Partition && a.Offset == b.Offset }

// publishRaw posts one message and classifies the answer; it never fails the test.
func publishRaw(ctx context.Context, cl *tc.Client, n *tc.Node, topic, payload string, hdr map[string]string) pubAnswer {
	r, err := cl.Do(ctx, http.MethodPost, n.URL()+"/v1/topics/"+url.PathEscape(topic)+"/messages", payload, hdr)
	if err != nil {
		return pubAnswer{err: fmt.Errorf("via %s: %w", n, err)}
	}
	a := pubAnswer{status: r.Status, hdr: r.Header, body: string(r.Body)}
	if r.Status == http.StatusOK || r.Status == http.StatusCreated {
		if err := r.JSON(&a.res); err != nil {
			a.status, a.body = -1, "undecodable 2xx body: "+err.Error()
		}
	} else {
		a.code, _ = r.CheckError()
	}
	return a
}

// pub is publishRaw with the cluster's client and a 15 s bound.
func pub(t testing.TB, n *tc.Node, topic, payload string, hdr map[string]string) pubAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return publishRaw(ctx, n.Client(), n, topic, payload, hdr)
}

func keyHdr(key string) map[string]string { return map[string]string{"Idempotency-Key": key} }

func prodHdr(id string, seq int) map[string]string {
	return map[string]string{"Mq-Producer-Id": id, "Mq-Producer-Seq": strconv.Itoa(seq)}
}

// mustCreated publishes and fails the test unless the answer is 201 duplicate:false.
func mustCreated(t testing.TB, n *tc.Node, topic, payload string, hdr map[string]string) tc.PublishResult {
	t.Helper()
	a := pub(t, n, topic, payload, hdr)
	if !a.created() {
		t.Fatalf("publish %q %v to %s via %s: %v; want 201 duplicate:false", payload, hdr, topic, n, a)
	}
	return a.res
}

// mustDup publishes and fails the test unless the answer is 200
// duplicate:true with want's placement.
func mustDup(t testing.TB, n *tc.Node, topic, payload string, hdr map[string]string, want tc.PublishResult) {
	t.Helper()
	a := pub(t, n, topic, payload, hdr)
	if !a.dup() || !samePlace(a.res, want) || a.res.Topic != topic {
		t.Fatalf("repeat publish %q %v to %s via %s: %v; want 200 duplicate:true at the original %s", payload, hdr, topic, n, a, place(want))
	}
}

// fnvPartition is the documented partition of a key: FNV-1a 32-bit mod n.
func fnvPartition(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// partitionKeyFor finds a partition key that maps to partition p of n.
func partitionKeyFor(p, n int) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("pk-%d", i)
		if fnvPartition(k, n) == p {
			return k
		}
	}
}

// ensureUp restarts any node a previous (failed) subtest left down and waits
// for the cluster to be ready.
func ensureUp(t *testing.T, c *tc.Cluster) {
	t.Helper()
	for _, n := range c.Nodes() {
		if !n.Running() {
			n.Restart()
		}
	}
	if _, err := c.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("cluster not ready: %v", err)
	}
}

// fetchAny fetches through the nodes in turn, retrying after no answer or
// 503 until ctx ends.
// fetchNothing fetches once through nodes and reports (t.Errorf) whatever
// arrives; format and args say why nothing should. It answers whether
// nothing did.
func fetchNothing(ctx context.Context, t *testing.T, nodes []*tc.Node, topic, group string, req tc.FetchRequest, format string, args ...any) bool {
	t.Helper()
	got, err := fetchAny(ctx, nodes, topic, group, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 0 {
		t.Errorf("%s: got %s; want nothing", fmt.Sprintf(format, args...), keysOf(got))
		return false
	}
	return true
}

func fetchAny(ctx context.Context, nodes []*tc.Node, topic, group string, req tc.FetchRequest) ([]tc.Message, error) {
	var last error
	for i := 0; ; i++ {
		n := nodes[i%len(nodes)]
		rctx, cancel := context.WithTimeout(ctx, time.Duration(req.WaitMs)*time.Millisecond+10*time.Second)
		msgs, _, err := n.Fetch(rctx, topic, group, req)
		cancel()
		if err == nil {
			return msgs, nil
		}
		last = err
		if !tc.Retryable(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fetch %s/%s: %v (last error: %v)", topic, group, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// receiptsOp posts ack/nack/extend for one receipt through the nodes in
// turn, retrying after no answer or 503. It returns the status; "stale"
// after an attempt whose outcome is unknown is reported as "ok?".
func receiptOp(ctx context.Context, nodes []*tc.Node, op, topic, group, receipt string, extra map[string]any) (string, error) {
	body := map[string]any{"receipts": []string{receipt}}
	for k, v := range extra {
		body[k] = v
	}
	path := "/v1/topics/" + url.PathEscape(topic) + "/groups/" + url.PathEscape(group) + "/" + op
	unknown := false
	var last error
	for i := 0; ; i++ {
		n := nodes[i%len(nodes)]
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := n.Do(rctx, http.MethodPost, path, body, map[string]string{"Mq-Timeout-Ms": "5000"})
		cancel()
		if err == nil && r.Status == http.StatusOK {
			var rr tc.ReceiptResults
			if err := r.JSON(&rr); err != nil {
				return "", err
			}
			if len(rr.Results) != 1 {
				return "", fmt.Errorf("%s via %s: %d results for 1 receipt: %s", op, n, len(rr.Results), systest.Shorten(string(r.Body)))
			}
			st := rr.Results[0].Status
			if st == "stale" && unknown {
				st = "ok?"
			}
			return st, nil
		}
		if err == nil {
			last = r.Expect(http.StatusOK)
			if r.Status != http.StatusServiceUnavailable {
				return "", last
			}
		} else {
			last = err
		}
		unknown = true
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s %s/%s: %v (last error: %v)", op, topic, group, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cappedErrors reports the first few of many similar failures, then a count.
type cappedErrors struct {
	t     testing.TB
	limit int
	n     int
}

func capErrors(t testing.TB, limit int) *cappedErrors { return &cappedErrors{t: t, limit: limit} }

func (c *cappedErrors) errorf(format string, args ...any) {
	c.t.Helper()
	if c.n++; c.n <= c.limit {
		c.t.Errorf(format, args...)
	}
}

func (c *cappedErrors) done() {
	if c.n > c.limit {
		c.t.Errorf("... %d such failures in all", c.n)
	}
}

// keysOf lists the idempotency keys of msgs with their positions.
func keysOf(msgs []tc.Message) string {
	var parts []string
	for _, m := range msgs {
		parts = append(parts, fmt.Sprintf("%q@%d/%d(retry %d)", m.IdempotencyKey, m.Partition, m.Offset, m.RetryCount))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func withKey(msgs []tc.Message, key string) []tc.Message {
	var out []tc.Message
	for _, m := range msgs {
		if m.IdempotencyKey == key {
			out = append(out, m)
		}
	}
	return out
}

// fetchUntilOthers fetches (leasing for leaseMs) until it holds others
// messages without key, or a fetch comes back empty, and returns all it got.
func fetchUntilOthers(ctx context.Context, t *testing.T, nodes []*tc.Node, topic, group, key string, others, leaseMs int) []tc.Message {
	t.Helper()
	var all []tc.Message
	for len(withoutKey(all, key)) < others && ctx.Err() == nil {
		got, err := fetchAny(ctx, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 2000, LeaseMs: leaseMs})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		all = append(all, got...)
	}
	return all
}

func withoutKey(msgs []tc.Message, key string) []tc.Message {
	var out []tc.Message
	for _, m := range msgs {
		if m.IdempotencyKey != key {
			out = append(out, m)
		}
	}
	return out
}

// groupStats polls the topic's stats until group g satisfies ok (bounded).
func groupStats(t testing.TB, n *tc.Node, topic, group string, d time.Duration, ok func(tc.GroupStats) bool) (tc.GroupStats, error) {
	s, err := systest.PollStats(tc.CtxFor(t, d), n, topic, func(s tc.TopicStats) bool {
		g, found := s.Groups[group]
		return found && ok(g)
	})
	return s.Groups[group], err
}

// sameKeyTwice stores two messages with key in a topic whose
// dedup_window_ms is short (publish K, wait past the window, publish K
// again), with others published around them, and then raises the window so
// that consumer-group idempotency remembers acks for long. It returns the
// two K placements.
func sameKeyTwice(t *testing.T, n *tc.Node, topic, key string, window time.Duration, hdr1, hdr2 map[string]string, before, after []string) (tc.PublishResult, tc.PublishResult) {
	t.Helper()
	h := func(extra map[string]string) map[string]string {
		m := keyHdr(key)
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	k1 := mustCreated(t, n, topic, key+" first", h(hdr1))
	firstDone := time.Now()
	for _, o := range before {
		mustCreated(t, n, topic, o, keyHdr(o))
	}
	time.Sleep(time.Until(firstDone.Add(window + 500*time.Millisecond)))
	a := pub(t, n, topic, key+" second", h(hdr2))
	if !a.created() {
		t.Fatalf("publish of %q more than %v after the first (dedup_window_ms %d): %v; want 201 with a new offset (the window has passed)",
			key, window+500*time.Millisecond, window.Milliseconds(), a)
	}
	k2 := a.res
	if samePlace(k1, k2) {
		t.Fatalf("second %q stored at the first one's place %s", key, place(k1))
	}
	for _, o := range after {
		mustCreated(t, n, topic, o, keyHdr(o))
	}
	if _, err := n.PutTopic(tc.CtxFor(t, 15*time.Second), topic, map[string]any{"dedup_window_ms": 600000}); err != nil {
		t.Fatalf("raise dedup_window_ms of %s: %v", topic, err)
	}
	return k1, k2
}

// ---- 1. racing duplicates ----

// 30 racers publish the same 50 keys through all three nodes at once:
// exactly one message per key is stored, every answer is 201 or 200
// duplicate:true, and every answer for a key names the same place.
func testDedupRacing(t *testing.T, c *tc.Cluster) {
	const topic = "dd-race"
	const keys, racers, parts = 50, 30, 3
	nodes := c.Nodes()
	tc.MustTopic(t, nodes[0], topic, map[string]any{"partitions": parts})
	ctx := tc.CtxFor(t, 90*time.Second)
	cl := tc.NewClient(15*time.Second, racers)

	type answer struct {
		racer int
		node  *tc.Node
		a     pubAnswer
	}
	var mu sync.Mutex
	answers := make([][]answer, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range keys {
				key := fmt.Sprintf("race-%02d", i)
				n := nodes[(g+i)%len(nodes)]
				rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				a := publishRaw(rctx, cl, n, topic, fmt.Sprintf("%s from racer %d", key, g), keyHdr(key))
				cancel()
				mu.Lock()
				answers[i] = append(answers[i], answer{g, n, a})
				mu.Unlock()
			}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d publishes (%d racers x %d keys) in %v", racers*keys, racers, keys, time.Since(began))

	creatorPayload := map[string]string{}
	placeOf := map[string]tc.PublishResult{}
	report := capErrors(t, 15)
	defer report.done()
	for i, as := range answers {
		key := fmt.Sprintf("race-%02d", i)
		created := 0
		var first *tc.PublishResult
		for _, x := range as {
			if !x.a.stored() {
				report.errorf("key %s, racer %d via %s: %v; want 201 or 200 duplicate:true", key, x.racer, x.node, x.a)
				continue
			}
			if x.a.created() {
				created++
				creatorPayload[key] = fmt.Sprintf("%s from racer %d", key, x.racer)
			}
			if x.a.res.Topic != topic || x.a.res.Partition != fnvPartition(key, parts) {
				report.errorf("key %s, racer %d via %s: answer %+v; want topic %s partition %d (FNV-1a of the key mod %d)",
					key, x.racer, x.node, x.a.res, topic, fnvPartition(key, parts), parts)
			}
			if first == nil {
				r := x.a.res
				first = &r
				placeOf[key] = r
			} else if !samePlace(*first, x.a.res) {
				report.errorf("key %s: answers name different places: %s and %s (racer %d via %s)", key, place(*first), place(x.a.res), x.racer, x.node)
			}
		}
		if created != 1 {
			report.errorf("key %s: %d answers were 201 duplicate:false out of %d; want exactly one", key, created, len(as))
		}
	}

	s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), nodes[1], topic, func(s tc.TopicStats) bool {
		return s.Messages == keys && s.NextOffsets() == keys
	})
	if err != nil {
		t.Errorf("after racing publishes of %d keys: stats messages %d, next offsets sum %d; want %d (%v)", keys, s.Messages, s.NextOffsets(), keys, err)
	}
	msgs, err := tc.Drain(ctx, nodes[2], topic, "race-audit", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stored := systest.DistinctByPosition(msgs)
	count := map[string]int{}
	for i, v := range systest.Values(t, stored) {
		m := stored[i]
		count[m.IdempotencyKey]++
		if want, ok := creatorPayload[m.IdempotencyKey]; ok && v != want {
			report.errorf("key %s: stored payload %q, but the 201 went to the publisher of %q", m.IdempotencyKey, v, want)
		}
		if p, ok := placeOf[m.IdempotencyKey]; ok && (p.Partition != m.Partition || p.Offset != m.Offset) {
			report.errorf("key %s: consumed at %d@%d, publish answers said %s", m.IdempotencyKey, m.Partition, m.Offset, place(p))
		}
	}
	for i := range keys {
		key := fmt.Sprintf("race-%02d", i)
		if count[key] != 1 {
			report.errorf("key %s: consumed %d times, want exactly once", key, count[key])
		}
	}
	if len(count) != keys {
		report.errorf("consumed %d distinct keys, want %d: %v", len(count), keys, count)
	}
}

// ---- 2. duplicates across a leader kill ----

// Publishers with unique keys and short deadlines keep publishing while the
// leader is killed with SIGKILL; every failed or timed-out publish is
// retried with the same key until it gets 201/200. Every key is stored
// exactly once.
func testDedupLeaderKill(t *testing.T, c *tc.Cluster) {
	ensureUp(t, c)
	leader := tc.MustLeader(t, c)
	const topic = "dd-kill"
	const workers = 6
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3})
	nodes := c.Nodes()
	cl := tc.NewClient(3*time.Second, 16)
	ctx := tc.CtxFor(t, 120*time.Second)

	type keyRec struct {
		ok        bool
		res       tc.PublishResult
		attempts  int
		dupAnswer bool
		failures  []string
		afterKill bool
	}
	var (
		mu         sync.Mutex
		recs       = map[string]*keyRec{}
		unexpected []string
		failKinds  = map[string]int{}
		okCount    atomic.Int64
		okAfter    atomic.Int64
		killed     atomic.Bool
		stop       atomic.Bool
		wg         sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load() && ctx.Err() == nil; i++ {
				key := fmt.Sprintf("kill-w%d-%05d", w, i)
				r := &keyRec{}
				mu.Lock()
				recs[key] = r
				mu.Unlock()
				deadline := time.Now().Add(40 * time.Second)
				for attempt := 0; time.Now().Before(deadline) && ctx.Err() == nil; attempt++ {
					n := nodes[(w+i+attempt)%len(nodes)]
					rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					a := publishRaw(rctx, cl, n, topic, key, map[string]string{"Idempotency-Key": key, "Mq-Timeout-Ms": "2000"})
					cancel()
					mu.Lock()
					r.attempts++
					if a.stored() {
						r.ok, r.res, r.dupAnswer, r.afterKill = true, a.res, a.dup(), killed.Load()
					} else {
						r.failures = append(r.failures, a.String())
						kind := "no answer"
						if a.err == nil {
							kind = fmt.Sprintf("%d %s", a.status, a.code)
						}
						failKinds[kind]++
						if a.err == nil && a.status != http.StatusServiceUnavailable {
							unexpected = append(unexpected, fmt.Sprintf("%s via %s: %v", key, n, a))
						}
					}
					mu.Unlock()
					if a.stored() {
						okCount.Add(1)
						if killed.Load() {
							okAfter.Add(1)
						}
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	// Publish for a while, kill the leader, go on until enough publishes
	// succeeded after the kill.
	for wait := time.Now().Add(15 * time.Second); okCount.Load() < 100 && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	before := okCount.Load()
	killed.Store(true)
	killedAt := time.Now()
	leader.Kill()
	for wait := time.Now().Add(30 * time.Second); (okAfter.Load() < 100 || time.Since(killedAt) < 3*time.Second) && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	after := okAfter.Load()

	mu.Lock()
	defer mu.Unlock()
	var retried, dupOnRetry int
	for key, r := range recs {
		if !r.ok {
			t.Errorf("key %s: no 201/200 in %d attempts over 40 s: %v", key, r.attempts, r.failures)
			continue
		}
		if r.attempts > 1 {
			retried++
			if r.dupAnswer {
				dupOnRetry++
			}
		} else if r.dupAnswer {
			t.Errorf("key %s: the first and only publish of a unique key answered duplicate:true at %s", key, place(r.res))
		}
	}
	for i, u := range unexpected {
		if i == 10 {
			t.Errorf("... %d unexpected answers in all", len(unexpected))
			break
		}
		t.Errorf("unexpected answer (want 2xx, 503 or no answer): %s", u)
	}
	t.Logf("killed leader %s after %d acknowledged publishes; %d keys acknowledged after the kill; %d keys in all; %d needed retries (failed attempts: %v), %d of them answered duplicate:true on a retry (an earlier attempt had been stored)",
		leader, before, after, len(recs), retried, failKinds, dupOnRetry)
	if before == 0 || after == 0 {
		t.Fatalf("publishes acknowledged before the kill: %d, after: %d; want some of each", before, after)
	}

	nl := tc.MustLeader(t, c)
	if nl == leader {
		t.Fatalf("killed node %s still named leader", leader)
	}
	s, err := systest.PollStats(tc.CtxFor(t, 15*time.Second), nl, topic, func(s tc.TopicStats) bool {
		return s.Messages == int64(len(recs)) && s.NextOffsets() == int64(len(recs))
	})
	if err != nil {
		t.Errorf("stats after the kill: messages %d, next offsets sum %d; want %d, one per key (%v)", s.Messages, s.NextOffsets(), len(recs), err)
	}
	var via *tc.Node
	for _, n := range c.Live() {
		if n != nl {
			via = n
		}
	}
	msgs, err := tc.Drain(ctx, via, topic, "kill-audit", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stored := systest.DistinctByPosition(msgs)
	report := capErrors(t, 15)
	defer report.done()
	count := map[string]int{}
	for i, v := range systest.Values(t, stored) {
		m := stored[i]
		if v != m.IdempotencyKey {
			report.errorf("message %d@%d: payload %q but idempotency_key %q", m.Partition, m.Offset, v, m.IdempotencyKey)
		}
		count[v]++
		if r, ok := recs[v]; !ok {
			report.errorf("consumed %q at %d@%d, which was never published", v, m.Partition, m.Offset)
		} else if r.ok && !(r.res.Partition == m.Partition && r.res.Offset == m.Offset) {
			report.errorf("key %s: consumed at %d@%d, the publish answer said %s", v, m.Partition, m.Offset, place(r.res))
		}
	}
	missing, twice := map[string]bool{}, map[string]bool{}
	for key, r := range recs {
		if count[key] == 0 && r.ok {
			missing[key] = true
		}
		if count[key] > 1 {
			twice[key] = true
		}
	}
	if len(missing) > 0 {
		t.Errorf("LOST: %d acknowledged keys never consumed: %s", len(missing), systest.Sample(missing))
	}
	if len(twice) > 0 {
		t.Errorf("DUPLICATED: %d keys stored more than once despite retrying with the same Idempotency-Key: %s", len(twice), systest.Sample(twice))
	}
	t.Logf("consumed %d distinct messages (%d deliveries) for %d keys", len(stored), len(msgs), len(recs))

	leader.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("cluster not ready after restarting %s: %v", leader, err)
	}
}

// ---- 3. producer sequences ----

func testDedupProducerSeq(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	f, f2 := fs[0], fs[len(fs)-1]
	const topic = "dd-producer"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})

	var placed [5]tc.PublishResult
	for seq := range 3 {
		placed[seq] = mustCreated(t, leader, topic, fmt.Sprintf("p seq %d", seq), prodHdr("p", seq))
	}
	// A repeat of a stored sequence: 200 with the original place.
	mustDup(t, leader, topic, "p seq 1 again", prodHdr("p", 1), placed[1])

	checkGap := func(n *tc.Node, id string, seq, expected int) {
		t.Helper()
		a := pub(t, n, topic, fmt.Sprintf("%s seq %d (gap)", id, seq), prodHdr(id, seq))
		if a.err != nil || a.status != http.StatusConflict || a.code != "sequence_gap" {
			t.Errorf("producer %s seq %d via %s (expected %d): %v; want 409 with code sequence_gap", id, seq, n, expected, a)
			return
		}
		if got := a.hdr.Get("Mq-Expected-Seq"); got != strconv.Itoa(expected) {
			t.Errorf("producer %s seq %d via %s: 409 with Mq-Expected-Seq %q; want %d", id, seq, n, got, expected)
		}
	}
	checkGap(leader, "p", 5, 3)
	placed[3] = mustCreated(t, leader, topic, "p seq 3", prodHdr("p", 3))

	// Through followers: they forward; answers and headers are the leader's.
	mustDup(t, f, topic, "p seq 2 again", prodHdr("p", 2), placed[2])
	checkGap(f, "p", 7, 4)
	placed[4] = mustCreated(t, f, topic, "p seq 4", prodHdr("p", 4))
	mustDup(t, f2, topic, "p seq 4 again", prodHdr("p", 4), placed[4])
	mustDup(t, f2, topic, "p seq 0 again", prodHdr("p", 0), placed[0])
	seen := map[string]bool{}
	for seq, p := range placed {
		if seen[place(p)] {
			t.Errorf("producer p seq %d stored at %s, a place already used by another sequence: %v", seq, place(p), placed)
		}
		seen[place(p)] = true
	}

	// Another producer has a sequence of its own and may start anywhere.
	q := mustCreated(t, f, topic, "q seq 100", prodHdr("q", 100))
	mustDup(t, leader, topic, "q seq 100 again", prodHdr("q", 100), q)
	checkGap(f2, "q", 102, 101)
	mustCreated(t, leader, topic, "p seq 5", prodHdr("p", 5))

	// A batch: the header's sequence is the first message's, message i has seq+i.
	type batchAnswer struct {
		Results []tc.PublishResult `json:"results"`
	}
	batch := func(n *tc.Node, seq int, vals ...string) (*tc.Response, batchAnswer) {
		t.Helper()
		var msgs []map[string]any
		for _, v := range vals {
			msgs = append(msgs, map[string]any{"value": v})
		}
		r, err := n.Do(tc.CtxFor(t, 15*time.Second), http.MethodPost, "/v1/topics/"+topic+"/messages:batch",
			map[string]any{"messages": msgs}, prodHdr("b", seq))
		if err != nil {
			t.Fatalf("batch via %s: %v", n, err)
		}
		var ba batchAnswer
		if r.Status == http.StatusOK {
			if err := r.JSON(&ba); err != nil {
				t.Fatal(err)
			}
		}
		return r, ba
	}
	r, b1 := batch(f, 10, "b10", "b11", "b12")
	if r.Status != http.StatusOK || len(b1.Results) != 3 {
		t.Fatalf("batch of 3 from producer b at seq 10 via %s: %d %s; want 200 with 3 results", f, r.Status, systest.Shorten(string(r.Body)))
	}
	for i, res := range b1.Results {
		if res.Duplicate {
			t.Errorf("batch seq 10 result %d: duplicate:true for a new sequence", i)
		}
	}
	mustCreated(t, leader, topic, "b13", prodHdr("b", 13))
	mustDup(t, f2, topic, "b11 again", prodHdr("b", 11), b1.Results[1])
	mustDup(t, leader, topic, "b12 again", prodHdr("b", 12), b1.Results[2])
	r, b2 := batch(f2, 10, "b10", "b11", "b12")
	if r.Status != http.StatusOK || len(b2.Results) != 3 {
		t.Fatalf("repeat of the batch at seq 10 via %s: %d %s; want 200 with 3 results", f2, r.Status, systest.Shorten(string(r.Body)))
	}
	for i, res := range b2.Results {
		if !res.Duplicate || !samePlace(res, b1.Results[i]) {
			t.Errorf("repeat of the batch at seq 10, result %d: %+v; want duplicate:true at %s", i, res, place(b1.Results[i]))
		}
	}
	r, _ = batch(leader, 20, "b20", "b21")
	if code, _ := r.CheckError(); r.Status != http.StatusConflict || code != "sequence_gap" || r.Header.Get("Mq-Expected-Seq") != "14" {
		t.Errorf("batch from producer b at seq 20 (last stored 13): %d %s, Mq-Expected-Seq %q; want 409 sequence_gap with Mq-Expected-Seq 14",
			r.Status, systest.Shorten(string(r.Body)), r.Header.Get("Mq-Expected-Seq"))
	}
	// A batch that repeats stored sequences and adds new ones says so
	// (not "gap"), stores nothing, and names the next expected sequence.
	r, _ = batch(f2, 12, "b12", "b13", "b14")
	if code, _ := r.CheckError(); r.Status != http.StatusConflict || code != "sequence_overlap" || r.Header.Get("Mq-Expected-Seq") != "14" {
		t.Errorf("batch from producer b at seq 12..14 (last stored 13): %d %s, Mq-Expected-Seq %q; want 409 sequence_overlap with Mq-Expected-Seq 14",
			r.Status, systest.Shorten(string(r.Body)), r.Header.Get("Mq-Expected-Seq"))
	}
	mustCreated(t, f, topic, "b14", prodHdr("b", 14))

	// Stored: p 0..5 (6), q 100 (1), b 10..14 (5).
	const want = 12
	if s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), f, topic, func(s tc.TopicStats) bool {
		return s.Messages == want && s.NextOffsets() == want
	}); err != nil {
		t.Errorf("stats: messages %d, next offsets sum %d; want %d (repeats and gaps store nothing) (%v)", s.Messages, s.NextOffsets(), want, err)
	}
}

// ---- batch keys ----

// Each message of a batch is deduplicated on its own, against stored keys
// and against earlier messages of the same batch.
func testDedupBatchKeys(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic = "dd-batch"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	p1 := mustCreated(t, leader, topic, "one", keyHdr("bk-1"))
	body := map[string]any{"messages": []map[string]any{
		{"value": "one again", "idempotency_key": "bk-1"},
		{"value": "two", "idempotency_key": "bk-2"},
		{"value": "two again", "idempotency_key": "bk-2"},
		{"value": "no key"},
	}}
	type batchAnswer struct {
		Results []tc.PublishResult `json:"results"`
	}
	send := func(n *tc.Node) batchAnswer {
		t.Helper()
		r, err := n.Do(tc.CtxFor(t, 15*time.Second), http.MethodPost, "/v1/topics/"+topic+"/messages:batch", body, nil)
		if err != nil {
			t.Fatalf("batch via %s: %v", n, err)
		}
		var ba batchAnswer
		if r.Status != http.StatusOK || r.JSON(&ba) != nil || len(ba.Results) != 4 {
			t.Fatalf("batch via %s: %d %s; want 200 with 4 results", n, r.Status, systest.Shorten(string(r.Body)))
		}
		return ba
	}
	b := send(fs[0]).Results
	if !b[0].Duplicate || !samePlace(b[0], p1) {
		t.Errorf("batch msg 0 (key stored before): %+v; want duplicate at %s", b[0], place(p1))
	}
	if b[1].Duplicate {
		t.Errorf("batch msg 1 (new key): %+v; want stored", b[1])
	}
	if !b[2].Duplicate || !samePlace(b[2], b[1]) {
		t.Errorf("batch msg 2 (key of msg 1): %+v; want duplicate at msg 1's %s", b[2], place(b[1]))
	}
	if b[3].Duplicate {
		t.Errorf("batch msg 3 (no key): %+v; want stored", b[3])
	}
	if b[1].Partition != fnvPartition("bk-2", 2) {
		t.Errorf("batch msg 1 with key bk-2 on partition %d, want %d", b[1].Partition, fnvPartition("bk-2", 2))
	}
	b2 := send(fs[len(fs)-1]).Results
	for i := range 3 {
		if !b2[i].Duplicate || !samePlace(b2[i], b[i]) {
			t.Errorf("repeated batch msg %d: %+v; want duplicate at %s", i, b2[i], place(b[i]))
		}
	}
	if b2[3].Duplicate || samePlace(b2[3], b[3]) {
		t.Errorf("repeated batch msg 3 (no key): %+v; want a new message", b2[3])
	}
	mustDup(t, fs[0], topic, "two once more", keyHdr("bk-2"), b[1])
	if s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), leader, topic, func(s tc.TopicStats) bool { return s.Messages == 4 }); err != nil {
		t.Errorf("stats: messages %d; want 4 (bk-1, bk-2 and two without key) (%v)", s.Messages, err)
	}
}

// ---- 4. window expiry ----

// A key whose dedup window has passed is new again; the window counts from
// the first publish (repeats do not extend it).
func testDedupWindowExpiry(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	// dupWithin is mustDup for a repeat that must land inside a short
	// window counted from since (before the original was sent): on a
	// machine so slow that it did not, the test is skipped, not failed.
	dupWithin := func(n *tc.Node, topic, payload, key string, want tc.PublishResult, since time.Time, window time.Duration) {
		t.Helper()
		a := pub(t, n, topic, payload, keyHdr(key))
		if a.dup() && samePlace(a.res, want) {
			return
		}
		if took := time.Since(since); took > window-100*time.Millisecond {
			t.Skipf("repeat of %s answered %v after %v, too late for its %v window: machine too slow for this test", key, a, took, window)
		}
		t.Fatalf("repeat of %s via %s %v after the original was sent (dedup_window_ms %d): %v; want 200 duplicate:true at %s",
			key, n, time.Since(since).Round(time.Millisecond), window.Milliseconds(), a, place(want))
	}
	const topic = "dd-window"
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 1500})
	firstStart := time.Now()
	first := mustCreated(t, fs[0], topic, "K first", keyHdr("K"))
	firstDone := time.Now()
	dupWithin(leader, topic, "K again", "K", first, firstStart, 1500*time.Millisecond)
	time.Sleep(time.Until(firstDone.Add(2500 * time.Millisecond)))
	secondStart := time.Now()
	a := pub(t, fs[len(fs)-1], topic, "K after the window", keyHdr("K"))
	if !a.created() || samePlace(a.res, first) {
		t.Fatalf("publish of K 2.5 s after the first (dedup_window_ms 1500): %v; want 201 with a new offset (first was at %s)", a, place(first))
	}
	dupWithin(fs[0], topic, "K again after the window", "K", a.res, secondStart, 1500*time.Millisecond)
	if s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), leader, topic, func(s tc.TopicStats) bool { return s.Messages == 2 }); err != nil {
		t.Errorf("stats: messages %d; want 2 (%v)", s.Messages, err)
	}

	// Window 3000 ms: the first publish is answered at T; a repeat at
	// T+1.5 s is a duplicate; a publish sent after T+3.3 s is new, though
	// it is within 3 s of the repeat.
	const topic2 = "dd-window-ext"
	tc.MustTopic(t, leader, topic2, map[string]any{"dedup_window_ms": 3000})
	e1Start := time.Now()
	e1 := mustCreated(t, leader, topic2, "E first", keyHdr("E"))
	t0 := time.Now()
	time.Sleep(time.Until(t0.Add(1500 * time.Millisecond)))
	repStart := time.Now()
	dupWithin(fs[0], topic2, "E repeat", "E", e1, e1Start, 3000*time.Millisecond)
	time.Sleep(time.Until(t0.Add(3300 * time.Millisecond)))
	a = pub(t, leader, topic2, "E after the window", keyHdr("E"))
	if !a.created() {
		t.Errorf("publish of E %v after the first one's answer (dedup_window_ms 3000) and %v after a repeat was sent: %v; want 201 (the window counts from the first publish; repeats do not extend it)",
			time.Since(t0).Round(time.Millisecond), time.Since(repStart).Round(time.Millisecond), a)
	}
}

// ---- 5. consumer-group idempotency: acked key skipped ----

func testDedupGroupAckedSkipped(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	f := fs[0]
	const topic, key = "dd-group-skip", "order-7"
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 1500})
	ctx := tc.CtxFor(t, 40*time.Second)
	// g2 exists from the start, so that retention keeps what g1 acks.
	if r, err := leader.Do(ctx, http.MethodPut, "/v1/topics/"+topic+"/groups/g2", map[string]any{}, nil); err != nil || r.Status/100 != 2 {
		t.Fatalf("PUT group g2: %v %v", r, err)
	}
	k1, k2 := sameKeyTwice(t, leader, topic, key, 1500*time.Millisecond, nil, nil, []string{"other-1"}, []string{"other-2"})

	// g1 takes the first K alone and acks it.
	msgs, err := fetchAny(ctx, []*tc.Node{f}, topic, "g1", tc.FetchRequest{Max: 1, WaitMs: 2000, LeaseMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].IdempotencyKey != key || msgs[0].Partition != k1.Partition || msgs[0].Offset != k1.Offset {
		t.Fatalf("g1 first fetch (max 1): %s; want the first %q at %s", keysOf(msgs), key, place(k1))
	}
	if st, err := receiptOp(ctx, []*tc.Node{f}, "ack", topic, "g1", msgs[0].Receipt, nil); err != nil || (st != "ok" && st != "ok?") {
		t.Fatalf("g1 ack of %q: %q %v; want ok", key, st, err)
	}
	// The rest of the topic: the others, never the second K.
	var rest []tc.Message
	for ctx.Err() == nil {
		got, err := fetchAny(ctx, []*tc.Node{leader, f}, topic, "g1", tc.FetchRequest{Max: 10, WaitMs: 1500, LeaseMs: 30000})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		rest = append(rest, got...)
		if err := tc.AckAll(ctx, f, topic, "g1", got); err != nil {
			t.Fatal(err)
		}
	}
	if ks := withKey(rest, key); len(ks) > 0 {
		t.Errorf("g1 acked %q at %s, then got %s again (second message at %s): consumer-group idempotency should have skipped it",
			key, place(k1), keysOf(ks), place(k2))
	}
	if len(withoutKey(rest, key)) != 2 {
		t.Errorf("g1 after the ack: got %s; want other-1 and other-2", keysOf(rest))
	}
	g, err := groupStats(t, leader, topic, "g1", 10*time.Second, func(g tc.GroupStats) bool {
		return g.DuplicatesSkipped >= 1 && g.Backlog == 0 && g.InFlight == 0
	})
	if err != nil {
		t.Errorf("g1 stats %+v; want duplicates_skipped >= 1, backlog 0, in_flight 0 (%v)", g, err)
	}

	// g2 never acked K: it gets K.
	got, err := fetchAny(ctx, []*tc.Node{f}, topic, "g2", tc.FetchRequest{Max: 10, WaitMs: 2000, LeaseMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if ks := withKey(got, key); len(ks) != 1 || !(ks[0].Partition == k1.Partition && ks[0].Offset == k1.Offset) {
		t.Errorf("g2 (never acked %q) fetched %s; want the first %q at %s exactly once (the second held behind it)", key, keysOf(got), key, place(k1))
	}
}

// ---- 6. consumer-group idempotency: same key held while leased ----

func testDedupGroupHeld(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	f := fs[0]
	const topic, key, group = "dd-group-held", "invoice-42", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2, "dedup_window_ms": 1500,
		"backoff_base_ms": 0, "backoff_jitter_ms": 0, "max_retry": 50})
	// The two K on different partitions.
	k1, k2 := sameKeyTwice(t, leader, topic, key, 1500*time.Millisecond,
		map[string]string{"Mq-Partition-Key": partitionKeyFor(0, 2)}, map[string]string{"Mq-Partition-Key": partitionKeyFor(1, 2)},
		[]string{"o-1", "o-2", "o-3"}, []string{"o-4", "o-5", "o-6"})
	if k1.Partition == k2.Partition {
		t.Fatalf("the two %q landed on one partition (%s, %s); want different partitions via Mq-Partition-Key", key, place(k1), place(k2))
	}
	ctx := tc.CtxFor(t, 50*time.Second)
	nodes := []*tc.Node{f, leader}

	// Fetch everything: the six others and exactly one K.
	all := fetchUntilOthers(ctx, t, nodes, topic, group, key, 6, 30000)
	ks := withKey(all, key)
	if len(ks) != 1 || len(withoutKey(all, key)) != 6 {
		t.Fatalf("fetching everything: got %s; want the six others and exactly one %q (the other held while it is leased)", keysOf(all), key)
	}
	held := ks[0]
	if err := tc.AckAll(ctx, f, topic, group, withoutKey(all, key)); err != nil {
		t.Fatal(err)
	}
	if g, err := groupStats(t, leader, topic, group, 10*time.Second, func(g tc.GroupStats) bool {
		return g.InFlight == 1 && g.Backlog == 1
	}); err != nil {
		t.Errorf("stats with one %q leased and one held: %+v; want in_flight 1, backlog 1 (held counts as backlog) (%v)", key, g, err)
	}
	if !fetchNothing(ctx, t, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1000, LeaseMs: 30000},
		"fetch while %q is leased at %d@%d", key, held.Partition, held.Offset) {
		t.FailNow()
	}

	// Nack it: one K (either) becomes deliverable, and only one.
	if st, err := receiptOp(ctx, nodes, "nack", topic, group, held.Receipt, map[string]any{"delay_ms": 0, "reason": "test"}); err != nil || st != "ok" {
		t.Fatalf("nack of the leased %q: %q %v; want ok", key, st, err)
	}
	got, err := fetchAny(ctx, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 3000, LeaseMs: 800})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].IdempotencyKey != key {
		t.Fatalf("fetch after the nack: got %s; want exactly one %q", keysOf(got), key)
	}
	second := got[0]

	// Let its 800 ms lease expire: again exactly one K.
	got = nil
	for len(got) == 0 && ctx.Err() == nil {
		got, err = fetchAny(ctx, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1000, LeaseMs: 30000})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || got[0].IdempotencyKey != key {
		t.Fatalf("fetch after the 800 ms lease of %d@%d expired: got %s; want exactly one %q", second.Partition, second.Offset, keysOf(got), key)
	}
	third := got[0]
	t.Logf("deliveries of %q: %d@%d (nacked), %d@%d (lease expired), %d@%d (acked)", key,
		held.Partition, held.Offset, second.Partition, second.Offset, third.Partition, third.Offset)

	// Ack it: the other K is skipped for good.
	if st, err := receiptOp(ctx, nodes, "ack", topic, group, third.Receipt, nil); err != nil || (st != "ok" && st != "ok?") {
		t.Fatalf("ack of %q: %q %v; want ok", key, st, err)
	}
	fetchNothing(ctx, t, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1500, LeaseMs: 30000},
		"fetch after acking %q (the other %q is a processed duplicate)", key, key)
	if g, err := groupStats(t, leader, topic, group, 10*time.Second, func(g tc.GroupStats) bool {
		return g.DuplicatesSkipped >= 1 && g.Backlog == 0 && g.InFlight == 0
	}); err != nil {
		t.Errorf("stats after the ack: %+v; want duplicates_skipped >= 1, backlog 0, in_flight 0 (%v)", g, err)
	}
	if s, err := leader.Stats(ctx, topic); err != nil || s.NextOffsets() != 8 {
		t.Errorf("topic stats: next offsets sum %d (%v); want 8 (both %q stored)", s.NextOffsets(), err, key)
	}
}

// ---- DLQ replay of an already processed key ----

func testDedupGroupDLQReplay(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	f := fs[0]
	const topic, key, group = "dd-group-dlq", "refund-9", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 1500, "backoff_base_ms": 0, "backoff_jitter_ms": 0})
	k1, k2 := sameKeyTwice(t, leader, topic, key, 1500*time.Millisecond, nil, nil, nil, nil)
	ctx := tc.CtxFor(t, 40*time.Second)
	nodes := []*tc.Node{f, leader}

	got, err := fetchAny(ctx, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 2000, LeaseMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].IdempotencyKey != key {
		t.Fatalf("first fetch: %s; want exactly one %q", keysOf(got), key)
	}
	dead := got[0]
	if st, err := receiptOp(ctx, nodes, "nack", topic, group, dead.Receipt, map[string]any{"retryable": false, "reason": "poison"}); err != nil || st != "ok" {
		t.Fatalf("non-retryable nack: %q %v", st, err)
	}
	got, err = fetchAny(ctx, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 3000, LeaseMs: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].IdempotencyKey != key || (got[0].Partition == dead.Partition && got[0].Offset == dead.Offset) {
		t.Fatalf("fetch after the first %q went to the DLQ: %s; want the other one (%s / %s)", key, keysOf(got), place(k1), place(k2))
	}
	if st, err := receiptOp(ctx, nodes, "ack", topic, group, got[0].Receipt, nil); err != nil || (st != "ok" && st != "ok?") {
		t.Fatalf("ack: %q %v", st, err)
	}
	r, err := f.Do(ctx, http.MethodGet, "/v1/topics/"+topic+"/groups/"+group+"/dlq?idempotency_key="+key, nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("list DLQ: %v %v", r, err)
	}
	var dl struct {
		DeadLetters []json.RawMessage `json:"dead_letters"`
	}
	if err := r.JSON(&dl); err != nil || len(dl.DeadLetters) != 1 {
		t.Fatalf("DLQ for key %q: %s (%v); want one dead letter", key, systest.Shorten(string(r.Body)), err)
	}
	r, err = f.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/groups/"+group+"/dlq/replay", map[string]any{"all": true}, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("replay DLQ: %v %v", r, err)
	}
	if g, err := groupStats(t, leader, topic, group, 10*time.Second, func(g tc.GroupStats) bool { return g.DLQ == 0 }); err != nil {
		t.Fatalf("DLQ not replayed: %+v (%v)", g, err)
	}
	fetchNothing(ctx, t, nodes, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1500, LeaseMs: 30000},
		"after replaying a dead letter whose key %q the group had processed", key)
	if g, err := groupStats(t, leader, topic, group, 10*time.Second, func(g tc.GroupStats) bool {
		return g.DuplicatesSkipped >= 1 && g.Backlog == 0 && g.InFlight == 0 && g.DLQ == 0
	}); err != nil {
		t.Errorf("stats after the replay: %+v; want duplicates_skipped >= 1, nothing pending (%v)", g, err)
	}
}

// ---- 7. consumer-group idempotency across a leader failover ----

func testDedupGroupFailover(t *testing.T, c *tc.Cluster) {
	ensureUp(t, c)
	leader, fs := tc.MustRoles(t, c)
	const topic, key, group = "dd-fo-group", "payment-3", "g"
	tc.MustTopic(t, leader, topic, map[string]any{"dedup_window_ms": 1500})
	k1, k2 := sameKeyTwice(t, leader, topic, key, 1500*time.Millisecond, nil, nil, []string{"fo-1"}, []string{"fo-2"})
	ctx := tc.CtxFor(t, 90*time.Second)

	all := fetchUntilOthers(ctx, t, fs, topic, group, key, 2, 20000)
	ks := withKey(all, key)
	if len(ks) != 1 || len(withoutKey(all, key)) != 2 {
		t.Fatalf("fetch before the failover: %s; want fo-1, fo-2 and exactly one %q (%s / %s)", keysOf(all), key, place(k1), place(k2))
	}
	leased := ks[0]
	leasedAt := time.Now()
	if err := tc.AckAll(ctx, fs[0], topic, group, withoutKey(all, key)); err != nil {
		t.Fatal(err)
	}

	leader.Kill()
	nl := tc.MustLeader(t, c)
	if nl == leader {
		t.Fatalf("killed %s still named leader", leader)
	}
	live := c.Live()
	t.Logf("killed leader %s; new leader %s after %v", leader, nl, time.Since(leasedAt).Round(time.Millisecond))
	fetchNothing(ctx, t, live, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1000, LeaseMs: 20000},
		"fetch on the new leader while %q is still leased (lease 20 s)", key)
	st, err := receiptOp(ctx, live, "ack", topic, group, leased.Receipt, nil)
	if err != nil || (st != "ok" && st != "ok?") {
		t.Fatalf("ack of %q at %d@%d after the failover, %v into its 20 s lease: %q %v; want ok",
			key, leased.Partition, leased.Offset, time.Since(leasedAt).Round(time.Millisecond), st, err)
	}
	fetchNothing(ctx, t, live, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1500, LeaseMs: 20000},
		"fetch after acking %q on the new leader", key)
	if g, err := groupStats(t, nl, topic, group, 10*time.Second, func(g tc.GroupStats) bool {
		return g.DuplicatesSkipped >= 1 && g.Backlog == 0 && g.InFlight == 0
	}); err != nil {
		t.Errorf("stats after the ack: %+v; want duplicates_skipped >= 1, backlog 0, in_flight 0 (%v)", g, err)
	}

	leader.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("cluster not ready after restarting %s: %v", leader, err)
	}
	fetchNothing(ctx, t, []*tc.Node{leader}, topic, group, tc.FetchRequest{Max: 10, WaitMs: 1000, LeaseMs: 20000},
		"fetch through the restarted old leader %s", leader)
}

// ---- 8. snapshot install and restart keep the dedup index ----

func testDedupSnapshot(t *testing.T, c *tc.Cluster) {
	ensureUp(t, c)
	leader, fs := tc.MustRoles(t, c)
	const topic, filler, ptopic = "dd-snap", "dd-snap-filler", "dd-snap-prod"
	const total, workers = 300, 6
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	tc.MustTopic(t, leader, filler, nil)
	tc.MustTopic(t, leader, ptopic, nil)
	ctx := tc.CtxFor(t, 150*time.Second)
	nodes := c.Nodes()

	var mu sync.Mutex
	placed := map[string]tc.PublishResult{}
	var wg sync.WaitGroup
	errs := make(chan string, total)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				key := fmt.Sprintf("snap-%03d", i)
				n := nodes[i%len(nodes)]
				rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				a := publishRaw(rctx, n.Client(), n, topic, key, keyHdr(key))
				cancel()
				if !a.created() {
					errs <- fmt.Sprintf("publish %s via %s: %v", key, n, a)
					continue
				}
				mu.Lock()
				placed[key] = a.res
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	var prod [5]tc.PublishResult
	for seq := range prod {
		prod[seq] = mustCreated(t, leader, ptopic, fmt.Sprintf("ps %d", seq), prodHdr("ps", seq))
	}

	// Write filler until every node has a snapshot that covers the keys.
	lci, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	target := lci.AppliedIndex
	snapCtx := tc.CtxFor(t, 40*time.Second)
	for i := 0; ; i++ {
		done := true
		var views []string
		for _, n := range nodes {
			ci, err := n.Cluster(snapCtx)
			views = append(views, fmt.Sprintf("%s: snapshot %d applied %d (%v)", n.ID(), ci.LastSnapshotIndex, ci.AppliedIndex, err))
			if err != nil || ci.LastSnapshotIndex < target {
				done = false
			}
		}
		if done {
			break
		}
		if snapCtx.Err() != nil {
			t.Fatalf("no snapshot at index >= %d on every node within 40 s: %s", target, strings.Join(views, "; "))
		}
		for j := range 20 {
			if _, _, err := leader.Publish(snapCtx, filler, []byte(fmt.Sprintf("f-%d-%d", i, j)), nil); err != nil && snapCtx.Err() == nil {
				t.Fatalf("filler publish: %v", err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Wipe a follower: it comes back from the leader's snapshot.
	f, o := fs[0], fs[1]
	f.Kill()
	f.Wipe()
	f.Restart()
	if err := f.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("wiped follower %s not ready: %v", f, err)
	}
	waitApplied := func(n *tc.Node, idx uint64) tc.ClusterInfo {
		t.Helper()
		wctx := tc.CtxFor(t, 60*time.Second)
		for {
			ci, err := n.Cluster(wctx)
			if err == nil && ci.AppliedIndex >= idx {
				return ci
			}
			if wctx.Err() != nil {
				t.Fatalf("node %s: applied_index %d never reached %d (%v)", n, ci.AppliedIndex, idx, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	lci, err = leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fci := waitApplied(f, lci.AppliedIndex)
	t.Logf("wiped %s caught up: applied %d, last snapshot %d (leader %s applied %d, snapshot %d)",
		f, fci.AppliedIndex, fci.LastSnapshotIndex, leader, lci.AppliedIndex, lci.LastSnapshotIndex)
	if fci.LastSnapshotIndex < target {
		t.Errorf("wiped follower %s: last_snapshot_index %d < %d: it did not catch up from a snapshot covering the keys", f, fci.LastSnapshotIndex, target)
	}

	// Make the wiped node the leader: pause o, commit a few entries with the
	// leader and f, kill the leader, resume o. o's log is then behind f's,
	// so o cannot win an election against f.
	o.Pause()
	for i := range 3 {
		if _, _, err := leader.Publish(ctx, filler, []byte(fmt.Sprintf("while %s paused %d", o.ID(), i)), map[string]string{"Mq-Timeout-Ms": "5000"}); err != nil {
			o.Resume()
			t.Fatalf("publish with %s paused: %v", o, err)
		}
	}
	lci, err = leader.Cluster(ctx)
	if err != nil {
		o.Resume()
		t.Fatal(err)
	}
	waitApplied(f, lci.CommitIndex)
	leader.Kill()
	o.Resume()
	nl := tc.MustLeader(t, c)
	if nl != f {
		t.Logf("the wiped node %s did not become leader (%s did); the repeats below test forwarding only", f, nl)
	} else {
		t.Logf("the wiped node %s leads now", f)
	}

	checkRepeats := func(when string, via []*tc.Node) {
		t.Helper()
		var wg sync.WaitGroup
		problems := make(chan string, total+10)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < total; i += workers {
					key := fmt.Sprintf("snap-%03d", i)
					n := via[i%len(via)]
					var a pubAnswer
					for attempt := 0; attempt < 20; attempt++ {
						rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
						a = publishRaw(rctx, n.Client(), n, topic, key+" repeat", keyHdr(key))
						cancel()
						if a.err == nil && a.status != http.StatusServiceUnavailable {
							break
						}
						time.Sleep(250 * time.Millisecond)
					}
					if !a.dup() || !samePlace(a.res, placed[key]) {
						problems <- fmt.Sprintf("%s: repeat of %s via %s: %v; want 200 duplicate:true at %s", when, key, n, a, place(placed[key]))
					}
				}
			}()
		}
		wg.Wait()
		close(problems)
		k := 0
		for p := range problems {
			if k++; k <= 10 {
				t.Error(p)
			}
		}
		if k > 10 {
			t.Errorf("%s: %d of %d repeats wrong", when, k, total)
		}
		mustDup(t, via[0], ptopic, "ps 2 again", prodHdr("ps", 2), prod[2])
		if s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), via[0], topic, func(s tc.TopicStats) bool { return s.Messages == total }); err != nil {
			t.Errorf("%s: stats messages %d; want %d (%v)", when, s.Messages, total, err)
		}
	}
	checkRepeats("after snapshot install on "+f.ID(), []*tc.Node{f, o})
	a := pub(t, f, ptopic, "ps 9", prodHdr("ps", 9))
	if a.status != http.StatusConflict || a.code != "sequence_gap" || a.hdr.Get("Mq-Expected-Seq") != "5" {
		t.Errorf("producer ps seq 9 (last 4) after snapshot install: %v, Mq-Expected-Seq %q; want 409 sequence_gap, 5", a, a.hdr.Get("Mq-Expected-Seq"))
	}

	// SIGKILL every node and restart: the index is rebuilt from snapshot + log.
	c.KillAll()
	c.RestartAll()
	nl, err = c.WaitReady(tc.CtxFor(t, 60*time.Second))
	if err != nil {
		t.Fatalf("cluster not ready after kill -9 of every node: %v", err)
	}
	t.Logf("after kill -9 of every node and restart: leader %s", nl)
	checkRepeats("after kill -9 of every node", c.Nodes())
	mustCreated(t, nodes[0], ptopic, "ps 5", prodHdr("ps", 5))
}
