package cluster

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// SIGKILL the leader while eight clients publish through every node: every
// publish that got a 2xx is consumed afterwards, nothing that was never
// published appears, and no single publish is stored twice.
func TestKillLeaderUnderLoad(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader := tc.MustLeader(t, c)
	const topic = "kill-leader"
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3})

	client := tc.NewClient(4*time.Second, 16)
	nodes := c.Nodes()
	var (
		mu        sync.Mutex
		attempted = map[string]bool{}
		acked     = map[string]bool{}
		outcomes  = map[string]int{}
		killed    atomic.Bool
		afterKill atomic.Int64
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				payload := fmt.Sprintf("g%d-%06d", g, i)
				n := nodes[(g+i)%len(nodes)]
				mu.Lock()
				attempted[payload] = true
				mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				r, err := client.Do(ctx, http.MethodPost, n.URL()+"/v1/topics/"+topic+"/messages", payload,
					map[string]string{"Mq-Timeout-Ms": "3000"})
				cancel()
				outcome := "no answer"
				if err == nil {
					outcome = fmt.Sprint(r.Status)
				}
				mu.Lock()
				outcomes[outcome]++
				if err == nil && r.Status/100 == 2 {
					acked[payload] = true
				}
				mu.Unlock()
				if err == nil && r.Status/100 == 2 {
					if killed.Load() {
						afterKill.Add(1)
					}
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	killed.Store(true)
	leader.Kill()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("killed leader %s after %d acknowledged publishes; %d attempted, %d acknowledged in all, %d after the kill; outcomes %v",
		leader, before, len(attempted), len(acked), afterKill.Load(), outcomes)
	if before == 0 {
		t.Fatalf("no publish succeeded in 2 s before the kill; outcomes %v", outcomes)
	}

	newLeader := tc.MustLeader(t, c)
	if newLeader == leader {
		t.Fatalf("killed node %s still named leader", leader)
	}
	ctx := tc.CtxFor(t, 60*time.Second)
	var via *tc.Node
	for _, n := range c.Live() {
		if n != newLeader {
			via = n // consume through the surviving follower
		}
	}
	msgs, err := tc.Drain(ctx, via, topic, "audit", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stored := systest.DistinctByPosition(msgs)
	count := map[string]int{}
	for _, v := range systest.Values(t, stored) {
		count[v]++
	}
	missing, unknown, twice := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for p := range acked {
		if count[p] == 0 {
			missing[p] = true
		}
	}
	for v, k := range count {
		if !attempted[v] {
			unknown[v] = true
		}
		if k > 1 {
			twice[v] = true
		}
	}
	t.Logf("consumed %d distinct stored messages via %s (%d deliveries)", len(stored), via, len(msgs))
	if len(missing) > 0 {
		t.Errorf("LOST: %d of %d acknowledged publishes never consumed: %s", len(missing), len(acked), systest.Sample(missing))
	}
	if len(unknown) > 0 {
		t.Errorf("%d consumed payloads were never published: %s", len(unknown), systest.Sample(unknown))
	}
	if len(twice) > 0 {
		t.Errorf("%d payloads published once are stored at two offsets (a forwarded write was retried?): %s", len(twice), systest.Sample(twice))
	}
}

// SIGKILL every node at once and restart: every acknowledged publish and ack survives.
func TestKillAllRestart(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader := tc.MustLeader(t, c)
	ctx := tc.CtxFor(t, 120*time.Second)
	const topic = "durable"
	const total, ackedN = 200, 50
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3})
	for _, g := range []string{"g-acked", "g-all"} {
		r, err := leader.Do(ctx, http.MethodPut, "/v1/topics/"+topic+"/groups/"+g, map[string]any{}, nil)
		if err != nil || r.Status/100 != 2 {
			t.Fatalf("PUT group %s: %v %v", g, r, err)
		}
	}

	published := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, total)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := c.Node(w % 3)
			for i := w; i < total; i += 4 {
				p := fmt.Sprintf("msg-%04d", i)
				if _, _, err := n.Publish(ctx, topic, []byte(p), nil); err != nil {
					errs <- fmt.Errorf("publish %s via %s: %v", p, n, err)
					continue
				}
				mu.Lock()
				published[p] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Group g-acked processes exactly ackedN messages before the crash.
	var ackedMsgs []tc.Message
	for len(ackedMsgs) < ackedN {
		msgs, _, err := c.Node(1).Fetch(ctx, topic, "g-acked", tc.FetchRequest{Max: ackedN - len(ackedMsgs), WaitMs: 1000, LeaseMs: 120000})
		if err != nil {
			t.Fatalf("fetch g-acked: %v", err)
		}
		if err := tc.AckAll(ctx, c.Node(2), topic, "g-acked", msgs); err != nil {
			t.Fatal(err)
		}
		ackedMsgs = append(ackedMsgs, msgs...)
	}
	ackedSet := map[string]bool{}
	for _, v := range systest.Values(t, ackedMsgs) {
		ackedSet[v] = true
	}

	c.KillAll()
	c.RestartAll()
	if _, err := c.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("cluster not ready after kill -9 of all nodes and restart: %v", err)
	}
	for _, n := range c.Nodes() {
		s, err := systest.PollStats(tc.CtxFor(t, 10*time.Second), n, topic, func(s tc.TopicStats) bool {
			return s.Messages == total && s.NextOffsets() == total
		})
		if err != nil {
			t.Errorf("after restart, stats via %s: messages %d, next offsets sum %d; want %d and %d (%v)", n, s.Messages, s.NextOffsets(), total, total, err)
		}
	}
	all, err := tc.Drain(ctx, c.Node(0), topic, "g-all", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	systest.CheckExactly(t, "g-all after restart", systest.Values(t, systest.DistinctByPosition(all)), published)
	rest, err := tc.Drain(ctx, c.Node(1), topic, "g-acked", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for p := range published {
		if !ackedSet[p] {
			want[p] = true
		}
	}
	systest.CheckExactly(t, "g-acked after restart (acked before the crash must not come back)", systest.Values(t, systest.DistinctByPosition(rest)), want)
}

// With two of three nodes down, a write answers 503 with Retry-After within
// its deadline; after they come back, writes succeed again.
func TestQuorumLoss(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader, fs := tc.MustRoles(t, c)
	const topic = "quorum"
	tc.MustTopic(t, leader, topic, nil)
	tc.MustPublish(t, leader, topic, "before", nil)
	for _, f := range fs {
		f.Kill()
	}
	// First right after the kill (the survivor may still think it leads),
	// then once it has surely noticed.
	for i, pause := range []time.Duration{0, 3 * time.Second} {
		time.Sleep(pause)
		ctx := tc.CtxFor(t, 15*time.Second)
		start := time.Now()
		r, err := leader.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/messages", fmt.Sprintf("no quorum %d", i),
			map[string]string{"Mq-Timeout-Ms": "2000"})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("write %d without quorum: no answer after %v: %v", i, took, err)
		}
		if r.Status != http.StatusServiceUnavailable {
			t.Errorf("write %d without quorum: status %d %s, want 503", i, r.Status, systest.Shorten(string(r.Body)))
		}
		if r.Header.Get("Retry-After") == "" {
			t.Errorf("write %d without quorum: no Retry-After header (headers %v)", i, r.Header)
		}
		if _, err := r.CheckError(); err != nil {
			t.Errorf("write %d without quorum: %v", i, err)
		}
		if took > 5*time.Second {
			t.Errorf("write %d without quorum with Mq-Timeout-Ms 2000 took %v", i, took)
		}
	}
	if r, err := leader.Do(tc.CtxFor(t, 5*time.Second), http.MethodGet, "/healthz", nil, nil); err != nil || r.Status != 200 {
		t.Errorf("/healthz on the survivor: %v %v", r, err)
	}

	for _, f := range fs {
		f.Restart()
	}
	ctx := tc.CtxFor(t, 45*time.Second)
	if _, err := systest.PublishRetry(ctx, []*tc.Node{leader}, topic, "after"); err != nil {
		t.Fatalf("write after the two nodes came back: %v", err)
	}
	if _, err := c.WaitReady(ctx); err != nil {
		t.Fatalf("cluster not ready after restart: %v", err)
	}
}

// SIGTERM on the leader: it exits 0 within a few seconds and the others go on.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader := tc.MustLeader(t, c)
	const topic = "sigterm"
	tc.MustTopic(t, leader, topic, nil)
	tc.MustPublish(t, leader, topic, "before", nil)

	took, err := leader.StopWithin(10 * time.Second)
	if err != nil {
		t.Fatalf("SIGTERM on leader %s: %v (after %v)", leader, err, took)
	}
	if took > 5*time.Second {
		t.Errorf("leader %s took %v to exit after SIGTERM", leader, took)
	}
	ctx := tc.CtxFor(t, 30*time.Second)
	start := time.Now()
	if _, err := systest.PublishRetry(ctx, c.Live(), topic, "after"); err != nil {
		t.Fatalf("publish after the leader's graceful stop: %v", err)
	}
	t.Logf("leader %s exited in %v; first publish after it succeeded %v later", leader, took, time.Since(start))
	newLeader := tc.MustLeader(t, c)
	msgs, err := tc.Drain(ctx, newLeader, topic, "g", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := systest.Values(t, systest.DistinctByPosition(msgs))
	if len(got) < 2 {
		t.Errorf("after graceful stop: consumed %v, want before and after", got)
	}

	// A follower too, and the stopped node rejoins.
	f := c.Live()[0]
	if f == newLeader {
		f = c.Live()[1]
	}
	if took, err := f.StopWithin(10 * time.Second); err != nil || took > 5*time.Second {
		t.Errorf("SIGTERM on follower %s: %v after %v", f, err, took)
	}
	leader.Restart()
	f.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("cluster not ready after restarting the stopped nodes: %v", err)
	}
}

// SIGSTOP the leader (it keeps its sockets but goes silent): the others elect
// a new leader and take writes; after SIGCONT the old leader follows the new
// one and serves every acknowledged message.
func TestPausedLeader(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader, fs := tc.MustRoles(t, c)
	const topic = "paused"
	tc.MustTopic(t, leader, topic, nil)
	want := map[string]bool{"before": true}
	tc.MustPublish(t, fs[0], topic, "before", nil)

	leader.Pause()
	newLeader, err := c.Leader(tc.CtxFor(t, 20*time.Second))
	if err != nil {
		leader.Resume()
		t.Fatalf("no new leader while %s is paused: %v", leader, err)
	}
	ctx := tc.CtxFor(t, 60*time.Second)
	for i := range 20 {
		p := fmt.Sprintf("during-%02d", i)
		if _, err := systest.PublishRetry(ctx, fs, topic, p); err != nil {
			leader.Resume()
			t.Fatalf("publish while the old leader is paused: %v", err)
		}
		want[p] = true
	}
	leader.Resume()
	l, err := c.WaitReady(tc.CtxFor(t, 30*time.Second))
	if err != nil {
		t.Fatalf("cluster not ready after resuming %s: %v", leader, err)
	}
	t.Logf("paused %s; %s took over; leader after resume: %s", leader, newLeader, l)
	msgs, err := tc.Drain(ctx, leader, topic, "g", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := systest.Values(t, systest.DistinctByPosition(msgs))
	seen := map[string]bool{}
	for _, v := range got {
		if !want[v] {
			t.Errorf("consumed %q, which was never published", v)
		}
		seen[v] = true
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("acknowledged publish %q not served by the resumed old leader", p)
		}
	}
}
