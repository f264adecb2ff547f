package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqd/mqd/client"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// The Go client against a real node: failover past a dead address, typed
// errors, publish dedup, and the consumer loop's ack, nack, reject and lease
// extension.
func TestClientPackage(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	cl, err := client.New(client.Config{Servers: []string{dead, n.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := tc.CtxFor(t, 60*time.Second)
	const topic = "client-pkg"
	_, created, err := cl.PutTopic(ctx, topic, client.TopicConfig{"partitions": 2, "backoff_base_ms": 50,
		"backoff_jitter_ms": 0, "max_retry": 3})
	if err != nil || !created {
		t.Fatalf("PutTopic: created %v, %v", created, err)
	}
	if _, err := cl.Topic(ctx, "no-such-topic"); !client.IsCode(err, "topic_not_found") {
		t.Fatalf("Topic(no-such-topic): %v, want topic_not_found", err)
	}
	_, _, err = cl.PutTopic(ctx, topic, client.TopicConfig{"max_retyr": 1})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Message, "max_retyr") {
		t.Fatalf("PutTopic with a typo: %v, want a 400 naming the field", err)
	}
	values := []string{"ok-1", "slow", "fail-once", "poison", "ok-2"}
	for _, v := range values {
		r, err := cl.Publish(ctx, topic, []byte(v), client.PublishOptions{IdempotencyKey: "key-" + v, Attrs: map[string]string{"kind": "test"}})
		if err != nil || r.Duplicate {
			t.Fatalf("publish %s: %+v %v", v, r, err)
		}
	}
	again, err := cl.Publish(ctx, topic, []byte("ok-1"), client.PublishOptions{IdempotencyKey: "key-ok-1"})
	if err != nil || !again.Duplicate {
		t.Fatalf("republish: %+v %v, want a duplicate", again, err)
	}

	var mu sync.Mutex
	handled := map[string]int{}
	var problems []error
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- cl.Consume(cctx, topic, "g", func(hctx context.Context, m *client.Message) error {
			mu.Lock()
			handled[string(m.Value)]++
			tries := handled[string(m.Value)]
			mu.Unlock()
			if m.Attrs["kind"] != "test" {
				t.Errorf("%s: attrs %v", m.Value, m.Attrs)
			}
			switch string(m.Value) {
			case "slow": // three leases long: kept alive by extends
				select {
				case <-time.After(1800 * time.Millisecond):
				case <-hctx.Done():
					return hctx.Err()
				}
			case "fail-once":
				if tries == 1 {
					return errors.New("transient")
				}
			case "poison":
				return client.Reject(errors.New("unparseable"))
			}
			return nil
		}, client.ConsumeOptions{Lease: 600 * time.Millisecond, Wait: time.Second, Concurrency: 3,
			OnError: func(err error) { mu.Lock(); problems = append(problems, err); mu.Unlock() }})
	}()
	// Done when everything but the poison message is acked and it is dead.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := cl.Topic(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		g := st.Groups["g"]
		if g.Acked == 4 && g.DLQ == 1 && g.InFlight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group stats %+v after 30 s, want 4 acked and 1 dead", g)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume: %v", err)
	}
	mu.Lock()
	if handled["slow"] != 1 || handled["fail-once"] != 2 || handled["poison"] != 1 || handled["ok-1"] != 1 {
		t.Errorf("handled %v: want slow once (its lease extended), fail-once twice, poison once", handled)
	}
	if len(problems) != 0 {
		t.Errorf("consumer reported %v", problems)
	}
	mu.Unlock()
	page, err := cl.DeadLetters(ctx, topic, "g", client.DLQOptions{})
	if err != nil || len(page.DeadLetters) != 1 {
		t.Fatalf("dead letters: %+v %v", page, err)
	}
	dl := page.DeadLetters[0]
	if dl.IdempotencyKey != "key-poison" || !strings.Contains(dl.RejectReason, "unparseable") ||
		len(dl.History) != 1 || dl.History[0].Kind != "rejected" {
		t.Errorf("dead letter %+v", dl)
	}
	if err := cl.DeleteDeadLetter(ctx, topic, "g", dl.ID); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteDeadLetter(ctx, topic, "g", dl.ID); !client.IsCode(err, "dead_letter_not_found") {
		t.Errorf("second delete: %v", err)
	}
	st, err := cl.Cluster(ctx)
	if err != nil || st.Leader == nil || st.Leader.ID != n.ID() || len(st.Nodes) != 1 {
		t.Fatalf("cluster: %+v %v", st, err)
	}
}

// The client keeps publishing through a leader kill: it moves to the next
// node and resends with the same Idempotency-Key, so every publish succeeds
// and each message is stored once.
func TestClientFailoverLeaderKill(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	urls := []string{l.URL()} // the leader first: the client starts with it
	for _, f := range fs {
		urls = append(urls, f.URL())
	}
	cl, err := client.New(client.Config{Servers: urls, Timeout: 5 * time.Second, MaxAttempts: 40})
	if err != nil {
		t.Fatal(err)
	}
	ctx := tc.CtxFor(t, 120*time.Second)
	const topic, total, workers = "failover", 400, 8
	if _, _, err := cl.PutTopic(ctx, topic, client.TopicConfig{"partitions": 3}); err != nil {
		t.Fatal(err)
	}
	var published, dups atomic.Int64
	killed := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				r, err := cl.Publish(ctx, topic, []byte(fmt.Sprint(i)), client.PublishOptions{IdempotencyKey: fmt.Sprint("k-", i)})
				if err != nil {
					errs <- fmt.Errorf("publish %d: %w", i, err)
					return
				}
				if r.Duplicate {
					dups.Add(1)
				}
				if published.Add(1) == total/4 {
					l.Kill()
					close(killed)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case <-killed:
	default:
		t.Fatal("the leader was never killed")
	}
	st, err := cl.Topic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if st.Messages != total {
		t.Errorf("topic holds %d messages after %d keyed publishes through a leader kill, want exactly %d", st.Messages, total, total)
	}
	t.Logf("%d publishes, %d answered as duplicates of a lost answer's commit", published.Load(), dups.Load())
}
