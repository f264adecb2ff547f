package test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestFunctional runs the non-destructive scenarios in parallel on one shared
// three-node cluster; each subtest uses topics of its own. With data groups
// each topic's creation makes or uses a group whose leadership moves
// meanwhile (its election, then the hand-off to its preferred leader):
// before forwards refused for going round in circles were retried, 7 of
// the 9 creations there answered 503 "leadership is changing".
func TestFunctional(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, functional)
}

func functional(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 3, opts...)
	t.Run("PublishViaFollower", func(t *testing.T) { t.Parallel(); testPublishViaFollower(t, c) })
	t.Run("LeaseExpiry", func(t *testing.T) { t.Parallel(); testLeaseExpiry(t, c) })
	t.Run("LongPoll", func(t *testing.T) { t.Parallel(); testLongPoll(t, c) })
	t.Run("ConsumerGroups", func(t *testing.T) { t.Parallel(); testConsumerGroups(t, c) })
	t.Run("BadInput", func(t *testing.T) { t.Parallel(); systest.CheckBadInput(t, c) })
	t.Run("BadInputRaw", func(t *testing.T) { t.Parallel(); systest.CheckBadInputRaw(t, c) })
	t.Run("Retention", func(t *testing.T) { t.Parallel(); testRetention(t, c) })
	t.Run("TopicChanges", func(t *testing.T) { t.Parallel(); testTopicChanges(t, c) })
	t.Run("FirstFetchCreatesGroup", func(t *testing.T) { t.Parallel(); systest.CheckFirstFetchCreatesGroup(t, c) })
}

// A topic's new configuration governs the very next publish (the leader
// caches configurations between changes): more partitions are used at
// once, a deleted and recreated topic starts over, a lower size limit
// refuses what the old one took.
func testTopicChanges(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic = "cfg-change"
	tc.MustTopic(t, leader, topic, nil)
	for _, n := range []*tc.Node{leader, fs[0]} {
		tc.MustPublish(t, n, topic, "before the change", nil)
	}
	tc.MustTopic(t, fs[0], topic, map[string]any{"partitions": 4})
	for i := range 40 {
		tc.MustPublish(t, []*tc.Node{leader, fs[0]}[i%2], topic, fmt.Sprintf("after growing %d", i), nil)
	}
	ctx := tc.CtxFor(t, 15*time.Second)
	s, err := leader.Stats(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Partitions) != 4 || s.NextOffsets() != 42 {
		t.Fatalf("after growing to 4 partitions and 42 publishes: %d partitions, %d messages", len(s.Partitions), s.NextOffsets())
	}
	for _, p := range s.Partitions {
		if p.NextOffset == 0 {
			t.Errorf("partition %d got none of 40 round-robin publishes after growing: %+v", p.Partition, s.Partitions)
		}
	}

	if r, err := leader.Do(ctx, http.MethodDelete, "/v1/topics/"+topic, nil, nil); err != nil || r.Status/100 != 2 {
		t.Fatalf("delete %s: %v %v", topic, r, err)
	}
	tc.MustTopic(t, leader, topic, map[string]any{"max_message_bytes": 10})
	pr := tc.MustPublish(t, fs[0], topic, "0123456789", nil)
	if pr.Partition != 0 || pr.Offset != 0 {
		t.Errorf("first publish to the recreated topic: %+v, want partition 0 offset 0", pr)
	}
	r, err := leader.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/messages", "0123456789A", nil)
	if err != nil || r.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("11 bytes to a topic with max_message_bytes 10: %v %v, want 413", r, err)
	}
	tc.MustTopic(t, leader, topic, map[string]any{"max_message_bytes": 20})
	tc.MustPublish(t, leader, topic, "0123456789A", nil)
}

// Publish through one follower, fetch and ack through the other; stats agree.
func testPublishViaFollower(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	f1, f2 := fs[0], fs[1%len(fs)]
	ctx := tc.CtxFor(t, 30*time.Second)
	const topic = "via-follower"
	tc.MustTopic(t, f1, topic, nil)

	pr := tc.MustPublish(t, f1, topic, "hello through a follower", map[string]string{"Mq-Attr-Color": "blue"})
	if pr.Topic != topic || pr.Offset != 0 || pr.Duplicate {
		t.Fatalf("publish via follower %s: got %+v, want topic %q offset 0 duplicate false", f1, pr, topic)
	}
	if _, err := systest.PollStats(tc.CtxFor(t, 5*time.Second), f1, topic, func(s tc.TopicStats) bool {
		return s.Messages == 1 && s.NextOffsets() == 1 && s.Name == topic
	}); err != nil {
		t.Fatalf("stats after one publish: %v", err)
	}

	msgs, _, err := f2.Fetch(ctx, topic, "g1", tc.FetchRequest{Max: 10, WaitMs: 2000})
	if err != nil {
		t.Fatalf("fetch via other follower %s: %v", f2, err)
	}
	if len(msgs) != 1 {
		t.Fatalf("fetch via %s: got %d messages, want 1", f2, len(msgs))
	}
	m := msgs[0]
	if v := systest.Values(t, msgs)[0]; v != "hello through a follower" || m.Partition != pr.Partition || m.Offset != pr.Offset ||
		m.RetryCount != 0 || m.Receipt == "" || m.Topic != topic {
		t.Fatalf("fetched %+v (value %q), want the published message %+v with retry_count 0", m, v, pr)
	}
	if ts, err := time.Parse(time.RFC3339, m.PublishedAt); err != nil || time.Since(ts) > time.Minute || time.Since(ts) < -time.Minute {
		t.Errorf("published_at %q: not a recent RFC 3339 time (%v)", m.PublishedAt, err)
	}
	if m.Attrs["Color"] != "blue" && m.Attrs["color"] != "blue" {
		t.Errorf("attrs %v: want Color=blue from Mq-Attr-Color", m.Attrs)
	}
	res, _, err := f2.Ack(ctx, topic, "g1", []string{m.Receipt})
	if err != nil || len(res) != 1 || res[0].Status != "ok" {
		t.Fatalf("ack via %s: %+v, %v; want one ok", f2, res, err)
	}
	if _, err := systest.PollStats(tc.CtxFor(t, 5*time.Second), leader, topic, func(s tc.TopicStats) bool {
		g, ok := s.Groups["g1"]
		return ok && g.Backlog == 0 && g.InFlight == 0 && s.NextOffsets() == 1
	}); err != nil {
		t.Fatalf("stats after ack: %v", err)
	}
	r, err := f1.Do(ctx, http.MethodGet, "/v1/topics", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("GET /v1/topics via %s: %v %v", f1, r, err)
	}
}

// An unacked lease expires; the message comes back with retry_count 1 and the
// old receipt is stale.
func testLeaseExpiry(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	ctx := tc.CtxFor(t, 30*time.Second)
	const topic = "lease-expiry"
	tc.MustTopic(t, leader, topic, map[string]any{"backoff_base_ms": 100, "backoff_jitter_ms": 0})
	pr := tc.MustPublish(t, fs[0], topic, "lease me", nil)

	first, _, err := fs[0].Fetch(ctx, topic, "g", tc.FetchRequest{Max: 1, WaitMs: 2000, LeaseMs: 500})
	if err != nil || len(first) != 1 {
		t.Fatalf("first fetch: %d messages, %v; want 1", len(first), err)
	}
	if first[0].RetryCount != 0 {
		t.Errorf("first delivery retry_count %d, want 0", first[0].RetryCount)
	}
	time.Sleep(time.Second)

	var again []tc.Message
	deadline := time.Now().Add(8 * time.Second)
	for len(again) == 0 && time.Now().Before(deadline) {
		again, _, err = leader.Fetch(ctx, topic, "g", tc.FetchRequest{Max: 1, WaitMs: 1000, LeaseMs: 30000})
		if err != nil {
			t.Fatalf("second fetch: %v", err)
		}
	}
	if len(again) != 1 {
		t.Fatalf("message not redelivered within ~9 s of its 500 ms lease (backoff 100 ms, no jitter)")
	}
	m := again[0]
	if m.Partition != pr.Partition || m.Offset != pr.Offset || m.RetryCount != 1 {
		t.Fatalf("redelivered %d@%d retry_count %d, want %d@%d retry_count 1", m.Partition, m.Offset, m.RetryCount, pr.Partition, pr.Offset)
	}
	if m.Receipt == first[0].Receipt {
		t.Fatalf("redelivery reused the old receipt %q", m.Receipt)
	}
	res, _, err := fs[0].Ack(ctx, topic, "g", []string{first[0].Receipt, m.Receipt})
	if err != nil || len(res) != 2 {
		t.Fatalf("ack old+new: %+v %v", res, err)
	}
	if res[0].Status != "stale" || res[1].Status != "ok" {
		t.Fatalf("ack [old, new] receipts: statuses %q, %q; want stale, ok", res[0].Status, res[1].Status)
	}
	if res[0].Receipt != first[0].Receipt || res[1].Receipt != m.Receipt {
		t.Errorf("ack results not in request order: %+v", res)
	}
}

// A waiting fetch answers soon after a publish, through the leader and
// through a follower; an empty long-poll waits about wait_ms.
func testLongPoll(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	const topic = "long-poll"
	tc.MustTopic(t, leader, topic, nil)
	for i, via := range []*tc.Node{leader, fs[0]} {
		ctx := tc.CtxFor(t, 20*time.Second)
		type result struct {
			msgs    []tc.Message
			err     error
			elapsed time.Duration
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			msgs, _, err := via.Fetch(ctx, topic, "g", tc.FetchRequest{Max: 10, WaitMs: 5000})
			done <- result{msgs, err, time.Since(start)}
		}()
		time.Sleep(500 * time.Millisecond)
		payload := fmt.Sprintf("wake up %d", i)
		tc.MustPublish(t, fs[len(fs)-1], topic, payload, nil)
		published := time.Since(start)
		var r result
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatalf("long-poll via %s: no answer", via)
		}
		if r.err != nil {
			t.Fatalf("long-poll via %s: %v", via, r.err)
		}
		if len(r.msgs) != 1 || systest.Values(t, r.msgs)[0] != payload {
			t.Fatalf("long-poll via %s: got %d messages, want %q", via, len(r.msgs), payload)
		}
		if r.elapsed > 4*time.Second {
			t.Errorf("long-poll via %s (wait_ms 5000): answered %v after start, %v after the publish returned; want soon after the publish",
				via, r.elapsed, r.elapsed-published)
		}
		if err := tc.AckAll(ctx, via, topic, "g", r.msgs); err != nil {
			t.Fatal(err)
		}
	}
	ctx := tc.CtxFor(t, 10*time.Second)
	start := time.Now()
	msgs, _, err := fs[0].Fetch(ctx, topic, "g", tc.FetchRequest{Max: 10, WaitMs: 300})
	took := time.Since(start)
	if err != nil || len(msgs) != 0 {
		t.Fatalf("empty long-poll: %d messages, %v; want an empty list", len(msgs), err)
	}
	if took < 250*time.Millisecond || took > 3*time.Second {
		t.Errorf("empty long-poll with wait_ms 300 took %v", took)
	}
}

// Two groups each get every message; two consumers of one group never hold
// the same message at once.
func testConsumerGroups(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	ctx := tc.CtxFor(t, 60*time.Second)
	const topic = "groups"
	const n = 20
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 2})
	// Create the groups ahead: with retention_ms 0 a message is kept only
	// until every existing group has acked it.
	for _, g := range []string{"A", "B", "C"} {
		r, err := fs[0].Do(ctx, http.MethodPut, "/v1/topics/"+topic+"/groups/"+g, map[string]any{}, nil)
		if err != nil || r.Status/100 != 2 {
			t.Fatalf("PUT group %s: %v %v", g, r, err)
		}
	}
	want := map[string]bool{}
	for i := range n {
		p := fmt.Sprintf("m-%02d", i)
		want[p] = true
		tc.MustPublish(t, c.Node(i%3), topic, p, nil)
	}
	for _, g := range []string{"A", "B"} {
		msgs, err := tc.Drain(ctx, fs[0], topic, g, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		systest.CheckExactly(t, "group "+g, systest.Values(t, systest.DistinctByPosition(msgs)), want)
	}

	// Group C: two consumers on different nodes, long leases, no acks.
	var mu sync.Mutex
	held := map[systest.PosKey]string{}
	var overlaps []string
	var all [2][]tc.Message
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for ci, via := range []*tc.Node{leader, fs[0]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			empties := 0
			for empties < 3 && ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				msgs, _, err := via.Fetch(rctx, topic, "C", tc.FetchRequest{Max: 3, WaitMs: 200, LeaseMs: 60000})
				cancel()
				if err != nil {
					errs <- fmt.Errorf("consumer %d via %s: %v", ci, via, err)
					return
				}
				if len(msgs) == 0 {
					empties++
					continue
				}
				empties = 0
				mu.Lock()
				for _, m := range msgs {
					k := systest.PosKey{Partition: m.Partition, Offset: m.Offset}
					if other, dup := held[k]; dup {
						overlaps = append(overlaps, fmt.Sprintf("%d@%d to consumer %d while leased to %s", m.Partition, m.Offset, ci, other))
					}
					held[k] = fmt.Sprintf("consumer %d", ci)
				}
				all[ci] = append(all[ci], msgs...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(overlaps) > 0 {
		t.Errorf("group C: %d deliveries of messages still leased to the other consumer: %v", len(overlaps), overlaps)
	}
	if len(held) != n {
		t.Errorf("group C: %d distinct messages leased across two consumers, want %d", len(held), n)
	}
	for ci, via := range []*tc.Node{leader, fs[0]} {
		if len(all[ci]) > 0 {
			if err := tc.AckAll(ctx, via, topic, "C", all[ci]); err != nil {
				t.Error(err)
			}
		}
	}
}

// Retention: a full reject-publish topic answers 507; drop-head advances first_offset.
func testRetention(t *testing.T, c *tc.Cluster) {
	leader, fs := tc.MustRoles(t, c)
	ctx := tc.CtxFor(t, 30*time.Second)
	tc.MustTopic(t, leader, "ret-reject", map[string]any{"max_messages": 5})
	for i := range 5 {
		tc.MustPublish(t, fs[0], "ret-reject", fmt.Sprintf("r%d", i), nil)
	}
	_, r, err := fs[0].Publish(ctx, "ret-reject", []byte("r5"), nil)
	if r == nil {
		t.Fatalf("6th publish: %v", err)
	}
	if r.Status != http.StatusInsufficientStorage {
		t.Errorf("6th publish to a full reject-publish topic: status %d %s, want 507", r.Status, r.Body)
	} else if _, err := r.CheckError(); err != nil {
		t.Errorf("507 answer: %v", err)
	}

	tc.MustTopic(t, leader, "ret-drop", map[string]any{"max_messages": 5, "overflow": "drop-head"})
	for i := range 8 {
		tc.MustPublish(t, fs[0], "ret-drop", fmt.Sprintf("d%d", i), nil)
	}
	s, err := systest.PollStats(tc.CtxFor(t, 5*time.Second), leader, "ret-drop", func(s tc.TopicStats) bool {
		return len(s.Partitions) == 1 && s.Partitions[0].NextOffset == 8
	})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Partitions[0]
	if p.FirstOffset != 3 || p.Messages != 5 || s.Messages != 5 {
		t.Errorf("drop-head with max_messages 5 after 8 publishes: messages %d, partition %+v; want first_offset 3, next_offset 8, 5 messages", s.Messages, p)
	}
	msgs, err := tc.Drain(ctx, fs[0], "ret-drop", "late", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"d3": true, "d4": true, "d5": true, "d6": true, "d7": true}
	systest.CheckExactly(t, "new group on drop-head topic", systest.Values(t, msgs), want)
}
