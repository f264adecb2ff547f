package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// A node whose clock is 8 days ahead (MQD_TEST_CLOCK_OFFSET, test-only)
// measures its offset against the others, reports it in /metrics, answers
// /readyz 503 with the reason, and does not lead: even when leadership is
// handed to it (the leader stops gracefully while the other follower is
// paused, so the skewed one is the best-placed), it hands it off again
// before proposing anything. So its clock expires nothing: a dedup key
// and a lease taken before are still in force afterwards. With data
// groups, the same in the topic's group: its leader hands it to the
// skewed member, which hands it off again.
func TestClockSkewedNodeDoesNotLead(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, clockSkewedNodeDoesNotLead)
}

func clockSkewedNodeDoesNotLead(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 3, opts...)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader, fs := tc.MustRoles(t, c)
	skewed, other := fs[0], fs[1]
	// Every member's address recorded and probed by the leader first: the
	// paused follower must be one the leader can see go unreachable. (With
	// the skewed node killed within ~150 ms of the first election, the
	// other follower's address was sometimes never recorded: 2 runs of 8,
	// on the binary of efa6caf too.)
	want := map[string]bool{}
	for _, n := range c.Live() {
		want[n.ID()] = true
	}
	hctx, hcancel := context.WithTimeout(ctx, 20*time.Second)
	defer hcancel()
	if _, err := tc.WaitView(hctx, leader, "every member probed", systest.Healthy(want)); err != nil {
		t.Fatal(err)
	}
	tc.MustTopic(t, leader, "skew", map[string]any{"ack_timeout_ms": 300000})
	g := systest.TopicGroup(t, leader, "skew")
	if g != "default" {
		leader, skewed, other = systest.GroupRoles(t, c, "skew")
	}
	first := tc.MustPublish(t, leader, "skew", "one", map[string]string{"Idempotency-Key": "k1"})
	msgs, _, err := leader.Fetch(ctx, "skew", "g", tc.FetchRequest{Max: 1, LeaseMs: 300000})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("fetch: %d messages, %v", len(msgs), err)
	}

	skewed.Kill()
	skewed.SetEnv("MQD_TEST_CLOCK_OFFSET=8d")
	skewed.Restart()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := systest.WaitMetric(wctx, skewed, "mqd_clock_offset_seconds", func(v float64) bool { return v > 7*86400 }); err != nil {
		t.Fatal(err)
	}
	if err := systest.WaitMetric(wctx, skewed, "mqd_clock_offset_bad", func(v float64) bool { return v == 1 }); err != nil {
		t.Fatal(err)
	}
	r, err := skewed.Do(ctx, http.MethodGet, "/readyz", nil, nil)
	if err != nil || r.Status != 503 || !strings.Contains(string(r.Body), "max-clock-offset") {
		t.Fatalf("/readyz of the skewed node: %v %v, want 503 naming the clock offset", r, err)
	}
	for _, n := range []*tc.Node{leader, other} {
		if err := systest.WaitMetric(wctx, n, "mqd_clock_offset_bad", func(v float64) bool { return v == 0 }); err != nil {
			t.Fatal(err)
		}
	}
	// Let the skewed node catch up, then make it the best-placed follower.
	if _, err := tc.WaitView(wctx, skewed, "caught up", func(ci tc.ClusterInfo) bool {
		return ci.AppliedIndex > 0 && ci.AppliedIndex >= ci.CommitIndex && (g != "default" || ci.LeaderID() == leader.ID())
	}); err != nil {
		t.Fatal(err)
	}
	if g != "default" { // the topic's group led by leader again, and caught up on skewed
		systest.GroupRoles(t, c, "skew")
		systest.WaitSameApplied(t, g, leader, skewed)
	}
	other.Pause()
	for _, k := range []string{"k2", "k3", "k4"} {
		tc.MustPublish(t, leader, "skew", k, map[string]string{"Idempotency-Key": k})
	}
	// The stopping leader hands off to the skewed node: the other one is
	// paused (the leader hands off to a reachable node with a good clock
	// if it has one) and resumes once the skewed one was elected: with one
	// node paused and one skewed, no node can tell whose clock is wrong.
	systest.HandOffTo(wctx, t, leader, skewed, other, 10*time.Second)
	leader.Restart()

	// A leader other than the skewed node, serving.
	var l *tc.Node
	for l == nil || l == skewed {
		if ctx.Err() != nil {
			t.Fatalf("no leader other than the skewed node")
		}
		if g == "default" {
			l, _ = c.Leader(ctx)
		} else if _, id, _, err := systest.TopicPlacement(ctx, other, "skew"); err == nil && id != "" {
			l = c.NodeByID(id)
		}
		if l == nil || l == skewed {
			time.Sleep(100 * time.Millisecond)
		}
	}
	again, _, err := publishUntil2xx(ctx, l, "skew", "one-again", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Offset != first.Offset || again.Partition != first.Partition {
		t.Fatalf("re-publish of k1 after the skewed node was handed leadership: %+v, want a duplicate of %+v (its dedup entry was expired)", again, first)
	}
	res, _, err := l.Ack(ctx, "skew", "g", []string{msgs[0].Receipt})
	if err != nil || len(res) != 1 || res[0].Status != "ok" {
		t.Fatalf("ack of the 300 s lease: %+v %v, want ok (the lease was expired)", res, err)
	}
	log, _ := os.ReadFile(skewed.LogPath())
	t.Logf("skewed node %s: elected %d times, handed off for its clock %d times", skewed.ID(),
		strings.Count(string(log), "became leader"), strings.Count(string(log), "not leading: clock"))
	if g != "default" { // it was handed the topic's group, and handed it off
		var elected, handed int
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, " raft_group="+g) {
				elected += strings.Count(line, "became leader")
				handed += strings.Count(line, "not leading: clock")
			}
		}
		if elected == 0 || handed == 0 {
			t.Errorf("skewed node %s in data group %s: elected %d times, handed off for its clock %d times; want both", skewed.ID(), g, elected, handed)
		}
	}
	if _, err := l.Do(ctx, http.MethodGet, "/readyz", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// publishUntil2xx publishes with an idempotency key until a 2xx, retrying
// 503s and no answers (the leader may still be changing).
func publishUntil2xx(ctx context.Context, n *tc.Node, topic, payload, key string) (tc.PublishResult, *tc.Response, error) {
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		pr, r, err := n.Publish(rctx, topic, []byte(payload), map[string]string{"Idempotency-Key": key})
		cancel()
		if err == nil || !tc.Retryable(err) || ctx.Err() != nil {
			return pr, r, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitClockRecord waits until the node has recorded its clock in its data
// dir (every second): a restart then measures the time it was down.
func waitClockRecord(ctx context.Context, t *testing.T, n *tc.Node) {
	t.Helper()
	path := filepath.Join(n.DataDir(), "clock.json")
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("%s never written: %v", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restartWith kills n and starts it again with the test clock offset off
// and the extra flags (on top of its own).
func restartWith(t *testing.T, n *tc.Node, base []string, offset string, flags ...string) {
	t.Helper()
	n.Kill()
	n.SetEnv("MQD_TEST_CLOCK_OFFSET=" + offset)
	n.SetArgs(append(append([]string(nil), base...), flags...))
	n.Restart()
}

// The only voter of a cluster, restarted with its clock 8 days ahead, has
// nobody to compare clocks with: it compares with the clock it recorded
// when it last ran plus the time it was down (measured by the boot-time
// clock), does not lead and answers /readyz 503 saying why. Once told to
// accept it (POST /v1/cluster/clock/accept) it leads, and the state's time
// goes on from the time that really passed: a key published before is
// still a duplicate and a 10-minute lease taken before still acks.
func TestClockAheadOnlyVoterRefusedUntilAccepted(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := tc.CtxFor(t, 120*time.Second)
	n := tc.MustLeader(t, c)
	base := n.Args()
	tc.MustTopic(t, n, "solo", map[string]any{"ack_timeout_ms": 600000, "dedup_window_ms": 3600000})
	first := tc.MustPublish(t, n, "solo", "one", map[string]string{"Idempotency-Key": "k1"})
	msgs, _, err := n.Fetch(ctx, "solo", "g", tc.FetchRequest{Max: 1, LeaseMs: 600000})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("fetch: %d messages, %v", len(msgs), err)
	}
	waitClockRecord(ctx, t, n)

	restartWith(t, n, base, "8d")
	// Not ready (no leader known, then the clock's reason), never ready.
	var last string
	for {
		r, err := n.Do(ctx, http.MethodGet, "/readyz", nil, nil)
		if err == nil {
			last = fmt.Sprintf("%d %s", r.Status, r.Body)
			if r.Status == 503 && strings.Contains(string(r.Body), "--accept-clock") {
				t.Logf("refused: %s", last)
				break
			}
			if r.Status == 200 {
				t.Errorf("/readyz of the only voter 8 days ahead: %s, want 503 naming --accept-clock", last)
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("/readyz of the only voter 8 days ahead: last %s, want 503 naming --accept-clock", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r, err := n.Do(ctx, http.MethodPost, "/v1/topics/solo/messages", "two", map[string]string{"Mq-Timeout-Ms": "1500"}); err == nil && r.Status != 503 {
		t.Errorf("publish while refusing to lead: %d %s, want 503", r.Status, r.Body)
	} else if err == nil {
		t.Logf("publish while refusing to lead: %d %s", r.Status, r.Body)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := systest.WaitMetric(wctx, n, "mqd_clock_offset_bad", func(v float64) bool { return v == 1 }); err != nil {
		t.Error(err)
	}

	var acc struct {
		Accepted bool  `json:"accepted"`
		AheadMs  int64 `json:"ahead_ms"`
	}
	r, err := n.Do(ctx, http.MethodPost, "/v1/cluster/clock/accept", nil, nil)
	if err != nil || r.Status != 200 || r.JSON(&acc) != nil || !acc.Accepted || acc.AheadMs < 7*86400*1000 {
		t.Fatalf("POST /v1/cluster/clock/accept: %v %v, want accepted, about 8 days ahead", r, err)
	}
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	again, _, err := publishUntil2xx(ctx, n, "solo", "one-again", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Offset != first.Offset {
		t.Errorf("re-publish of k1 after the accepted jump: %+v, want a duplicate of %+v (its dedup entry was expired)", again, first)
	}
	res, _, err := n.Ack(ctx, "solo", "g", []string{msgs[0].Receipt})
	if err != nil || len(res) != 1 || res[0].Status != "ok" {
		t.Errorf("ack of the 10-minute lease after the accepted jump: %+v %v, want ok (the lease was expired)", res, err)
	}
	// Accepted once is accepted (the acceptance recorded the clock before
	// it answered): a restart on the same clock leads at once.
	restartWith(t, n, base, "8d")
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _, err := publishUntil2xx(ctx, n, "solo", "one-again", "k1"); err != nil || !again.Duplicate {
		t.Errorf("re-publish of k1 after a restart on the accepted clock: %+v %v, want a duplicate", again, err)
	}
}

// A clock put right after running 8 days ahead: the state's time did not
// follow the jump, so it does not stay frozen at a future stamp either: a
// 2 s lease taken after the clock was put right expires within seconds,
// and a nack's 500 ms delay redelivers.
func TestClockPutRightAfterJumpExpiresOnTime(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := tc.CtxFor(t, 120*time.Second)
	n := tc.MustLeader(t, c)
	base := n.Args()
	tc.MustTopic(t, n, "right", nil)
	waitClockRecord(ctx, t, n)

	restartWith(t, n, base, "8d", "--accept-clock")
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := systest.PublishRetry(ctx, []*tc.Node{n}, "right", "stamped 8 days ahead"); err != nil {
		t.Fatal(err)
	}
	restartWith(t, n, base, "0s")
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := systest.PublishRetry(ctx, []*tc.Node{n}, "right", "stamped on time"); err != nil {
		t.Fatal(err)
	}
	msgs, _, err := n.Fetch(ctx, "right", "g", tc.FetchRequest{Max: 10, LeaseMs: 2000})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("fetch: %d messages, %v; want both", len(msgs), err)
	}
	leased := time.Now()
	again := fetchWithin(ctx, t, n, "right", 2, 20*time.Second)
	t.Logf("2 s leases expired and redelivered after %v", time.Since(leased).Round(100*time.Millisecond))
	if res, _, err := n.Nack(ctx, "right", "g", []string{again[0].Receipt}, map[string]any{"delay_ms": 500}); err != nil || len(res) != 1 || res[0].Status != "ok" {
		t.Fatalf("nack: %+v %v", res, err)
	}
	nacked := time.Now()
	fetchWithin(ctx, t, n, "right", 1, 20*time.Second)
	t.Logf("nacked with a 500 ms delay: redelivered after %v", time.Since(nacked).Round(100*time.Millisecond))
}

// fetchWithin fetches group g of topic until want messages came back,
// failing after d.
func fetchWithin(ctx context.Context, t *testing.T, n *tc.Node, topic string, want int, d time.Duration) []tc.Message {
	t.Helper()
	end := time.Now().Add(d)
	var got []tc.Message
	for len(got) < want {
		if time.Now().After(end) || ctx.Err() != nil {
			t.Fatalf("%d of %d messages redelivered within %v: the state's time is frozen", len(got), want, d)
		}
		msgs, _, err := n.Fetch(ctx, topic, "g", tc.FetchRequest{Max: want, WaitMs: 1000, LeaseMs: 60000})
		if err == nil {
			got = append(got, msgs...)
		}
	}
	return got
}
