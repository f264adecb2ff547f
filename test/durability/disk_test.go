package durability

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// withTmpfs puts each node's data dir on a tmpfs of size bytes (mounted
// before the node starts, unmounted after the cluster is killed). It skips
// the test where mounting is not allowed, unless CI is set.
func withTmpfs(t *testing.T, size int64) tc.Option {
	t.Helper()
	probe := t.TempDir()
	if err := syscall.Mount("tmpfs", probe, "tmpfs", 0, "size=1m"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("cannot mount a tmpfs (needs root): %v", err)
		}
		t.Fatalf("CI: cannot mount a tmpfs: %v", err)
	}
	_ = syscall.Unmount(probe, syscall.MNT_DETACH)
	return tc.WithNodeArgs(func(n *tc.Node) []string {
		if err := os.MkdirAll(n.DataDir(), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", n.DataDir(), "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
			t.Fatalf("mount tmpfs on %s: %v", n.DataDir(), err)
		}
		// Registered after Start's own cleanup, so it runs before it: stop
		// the processes first.
		t.Cleanup(func() {
			if n.Running() {
				n.Kill()
			}
			_ = syscall.Unmount(n.DataDir(), syscall.MNT_DETACH)
		})
		return nil
	})
}

// freeBytes is the free space of the filesystem holding dir.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// Below --min-free-disk, writes that add data answer 507
// insufficient_storage and change nothing, while consumption and topic
// updates keep working; once space returns, writes resume by themselves.
func TestDiskLowRefusesWrites(t *testing.T) {
	t.Parallel()
	// 256 MiB: raft-wal preallocates 16 MiB segments there (a 16th of
	// the volume). The node keeps 16 MiB, one segment and its next
	// snapshot (under 1 MiB here) free.
	c := tc.Start(t, 1, withTmpfs(t, 256<<20), tc.WithFlags("--min-free-disk", "16MiB"))
	n := c.Node(0)
	ctx := tc.CtxFor(t, 90*time.Second)
	tc.MustTopic(t, n, "disk", nil)
	want := map[string]bool{}
	for i := range 5 {
		p := fmt.Sprintf("before-%d", i)
		want[p] = true
		tc.MustPublish(t, n, "disk", p, map[string]string{"Idempotency-Key": p})
	}
	tc.MustPublish(t, n, "disk", "poison", nil)
	msgs, _, err := n.Fetch(ctx, "disk", "g", tc.FetchRequest{Max: 10, LeaseMs: 60000})
	if err != nil || len(msgs) != 6 {
		t.Fatalf("fetch before filling: %d messages, %v", len(msgs), err)
	}
	var receipts []string
	for _, m := range msgs {
		if m.IdempotencyKey == "" {
			if _, _, err := n.Nack(ctx, "disk", "g", []string{m.Receipt}, map[string]any{"retryable": false, "reason": "poison"}); err != nil {
				t.Fatalf("nack poison: %v", err)
			}
			continue
		}
		receipts = append(receipts, m.Receipt)
	}

	// Fill the filesystem to 20 MiB free, under the 32 MiB and more kept
	// free.
	ballast := filepath.Join(n.DataDir(), "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, freeBytes(t, n.DataDir())-20<<20); err != nil {
		t.Fatalf("fallocate: %v", err)
	}
	f.Close()

	// The node reads free space at most 1 s late: wait until it has.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := systest.WaitMetric(wctx, n, "mqd_disk_free_bytes", func(v float64) bool { return v < 28<<20 }); err != nil {
		t.Fatal(err)
	}
	r, err := n.Do(ctx, http.MethodPost, "/v1/topics/disk/messages", "refused", map[string]string{"Idempotency-Key": "refused"})
	systest.ExpectCode(t, "publish with the disk low", r, err, 507, "insufficient_storage")
	r, err = n.Do(ctx, http.MethodPost, "/v1/topics/disk/messages:batch", map[string]any{"messages": []map[string]any{{"value": "x"}}}, nil)
	systest.ExpectCode(t, "batch with the disk low", r, err, 507, "insufficient_storage")
	r, err = n.Do(ctx, http.MethodPut, "/v1/topics/disk-new", nil, nil)
	systest.ExpectCode(t, "topic creation with the disk low", r, err, 507, "insufficient_storage")
	r, err = n.Do(ctx, http.MethodPost, "/v1/topics/disk/groups/g/dlq/replay", map[string]any{"all": true}, nil)
	systest.ExpectCode(t, "DLQ replay with the disk low", r, err, 507, "insufficient_storage")
	// Still allowed: updating a topic, consuming.
	r, err = n.Do(ctx, http.MethodPut, "/v1/topics/disk", map[string]any{"max_retry": 3}, nil)
	systest.ExpectCode(t, "topic update with the disk low", r, err, 200, "")
	res, _, err := n.Ack(ctx, "disk", "g", receipts)
	if err != nil {
		t.Fatalf("ack with the disk low: %v", err)
	}
	for _, x := range res {
		if x.Status != "ok" {
			t.Fatalf("ack with the disk low: %+v", res)
		}
	}
	if _, _, err := n.Fetch(ctx, "disk", "g2", tc.FetchRequest{Max: 10}); err != nil {
		t.Fatalf("fetch with the disk low: %v", err)
	}
	st, err := n.Stats(ctx, "disk")
	if err != nil {
		t.Fatal(err)
	}
	if st.NextOffsets() != 6 {
		t.Fatalf("refused writes stored something: %d messages, want 6", st.NextOffsets())
	}
	if _, err := n.Stats(ctx, "disk-new"); err == nil {
		t.Fatalf("refused topic creation created the topic")
	}

	// Space returns: writes resume without a restart.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if _, err := publishRetry507(ctx, n, "disk", "after"); err != nil {
		t.Fatalf("publish after space returned: %v", err)
	}
	tc.MustTopic(t, n, "disk-new", nil)
}

// publishRetry507 publishes until the answer is not 507 (space returning is
// noticed within a second).
func publishRetry507(ctx context.Context, n *tc.Node, topic, payload string) (tc.PublishResult, error) {
	for {
		pr, r, err := n.Publish(ctx, topic, []byte(payload), map[string]string{"Idempotency-Key": payload})
		if err == nil || r == nil || r.Status != 507 {
			return pr, err
		}
		select {
		case <-ctx.Done():
			return pr, fmt.Errorf("still 507: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// A node whose data dir really fills up (a 256 MiB tmpfs, default
// --min-free-disk: 5 %, plus one 16 MiB raft-wal segment and the next
// snapshot) refuses publishes with 507 before the disk is full,
// does not crash, and every acknowledged message is still delivered.
func TestDiskFillsUp(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, withTmpfs(t, 256<<20))
	n := c.Node(0)
	ctx := tc.CtxFor(t, 120*time.Second)
	tc.MustTopic(t, n, "fill", map[string]any{"max_message_bytes": 1 << 20})
	payload := make([]byte, 64<<10)
	acked := map[string]bool{}
	refused := 0
	for i := 0; i < 4000 && refused < 20; i++ {
		key := fmt.Sprintf("k%04d", i)
		copy(payload, key)
		_, r, err := n.Publish(ctx, "fill", payload, map[string]string{"Idempotency-Key": key})
		switch {
		case err == nil:
			acked[key] = true
		case r != nil && r.Status == 507:
			if code, _ := r.CheckError(); code != "insufficient_storage" {
				t.Fatalf("507 with code %q: %s", code, r.Body)
			}
			refused++
		default:
			t.Fatalf("publish %s: %v (after %d acknowledged)", key, err, len(acked))
		}
	}
	if refused == 0 {
		t.Fatalf("the disk never filled: %d acknowledged, free %d", len(acked), freeBytes(t, n.DataDir()))
	}
	t.Logf("acknowledged %d messages of 64 KiB, then 507; free %d bytes", len(acked), freeBytes(t, n.DataDir()))
	if !n.Running() {
		t.Fatalf("node exited with the disk full")
	}
	msgs, err := tc.Drain(ctx, n, "fill", "g", 500*time.Millisecond)
	if err != nil {
		t.Fatalf("drain with the disk full: %v", err)
	}
	got := map[string]bool{}
	for _, m := range msgs {
		got[m.IdempotencyKey] = true
	}
	for k := range acked {
		if !got[k] {
			t.Fatalf("acknowledged message %s not delivered (%d of %d delivered)", k, len(got), len(acked))
		}
	}
	if !n.Running() {
		t.Fatalf("node exited with the disk full")
	}
}

// A follower under its --min-free-disk stops the cluster's writes that add
// data (507, naming it) through the leader, which learns it from the
// follower's status: every member stores what the leader commits, and the
// leader used to keep accepting until the follower's disk filled and it
// stopped. Consumption goes on; once the follower has room, writes resume.
func TestFollowerDiskLowRefusesWrites(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 90*time.Second)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "fdisk", nil)
	tc.MustPublish(t, leader, "fdisk", "before", nil)
	f := followers[0]
	orig := f.Args()
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	// About an exbibyte: low on any disk (a percentage is not, on a
	// nearly empty tmpfs or a large fresh volume).
	f.SetArgs(append(append([]string(nil), orig...), "--min-free-disk", "1000000TiB"))
	f.Restart()
	r := publishUntil(t, leader, "fdisk", 507, 30*time.Second)
	if code, _ := r.CheckError(); code != "insufficient_storage" || !strings.Contains(string(r.Body), f.ID()) {
		t.Fatalf("publish with %s low on disk: %d %s, want 507 insufficient_storage naming it", f, r.Status, r.Body)
	}
	if msgs, _, err := leader.Fetch(ctx, "fdisk", "g", tc.FetchRequest{Max: 100}); err != nil || len(msgs) == 0 {
		t.Fatalf("fetch with a follower low on disk: %d messages, %v", len(msgs), err)
	}
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	f.SetArgs(orig)
	f.Restart()
	publishUntil(t, leader, "fdisk", 201, 30*time.Second)
}

// With data groups, a node low on disk refuses the writes of the groups it
// holds a replica of (507, naming it) and no others: only a group's members
// store what its leader commits. Before, every group's leader refused while
// any node was low, as the single group must.
func TestDiskLowMemberRefusesOnlyItsGroups(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithDataGroups())
	nodes := c.Nodes()
	ctx := tc.CtxFor(t, 90*time.Second)
	tc.MustTopic(t, nodes[0], "every", nil) // on all three nodes
	tc.MustTopic(t, nodes[0], "solo", map[string]any{"replicas": 1})
	_, _, reps, err := systest.TopicPlacement(ctx, nodes[0], "solo")
	if err != nil || len(reps) != 1 {
		t.Fatalf("topic solo: replicas %v %v, want 1", reps, err)
	}
	holder := c.NodeByID(reps[0])
	var low *tc.Node
	for _, n := range nodes {
		if n != holder {
			low = n
			break
		}
	}
	orig := low.Args()
	if err := low.Stop(); err != nil {
		t.Fatal(err)
	}
	low.SetArgs(append(append([]string(nil), orig...), "--min-free-disk", "1000000TiB"))
	low.Restart()
	if err := low.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	r := publishUntil(t, holder, "every", 507, 30*time.Second)
	if code, _ := r.CheckError(); code != "insufficient_storage" || !strings.Contains(string(r.Body), low.ID()) {
		t.Fatalf("publish to a topic %s holds with %s low on disk: %d %s, want 507 insufficient_storage naming it", low, low, r.Status, r.Body)
	}
	// The single-replica topic, on holder only: publishes go on, through
	// holder and through the node low on disk (which forwards them).
	for _, via := range []*tc.Node{holder, low} {
		r, err := via.Do(ctx, http.MethodPost, "/v1/topics/solo/messages", "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusCreated {
			t.Fatalf("publish to solo (on %s only) through %s with %s low on disk: %d %s, want 201", holder, via, low, r.Status, r.Body)
		}
	}
}

// publishUntil publishes to topic through n until a publish answers
// status, and returns that answer; it fails the test after within.
func publishUntil(t *testing.T, n *tc.Node, topic string, status int, within time.Duration) *tc.Response {
	t.Helper()
	ctx := tc.CtxFor(t, within)
	for {
		r, err := n.Do(ctx, http.MethodPost, "/v1/topics/"+topic+"/messages", "x", nil)
		if err == nil && r.Status == status {
			return r
		}
		select {
		case <-ctx.Done():
			t.Fatalf("publish to %s via %s: %v %v, want %d within %v", topic, n, r, err, status, within)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// minFreeSampler reads the free space of dir's filesystem every 2 ms until
// stopped, and returns the least it saw.
func minFreeSampler(t *testing.T, dir string) (stop func() int64) {
	t.Helper()
	done, out := make(chan struct{}), make(chan int64, 1)
	go func() {
		least := freeBytes(t, dir)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				out <- least
				return
			case <-tick.C:
			}
			var st syscall.Statfs_t
			if syscall.Statfs(dir, &st) == nil {
				least = min(least, int64(st.Bavail)*st.Bsize)
			}
		}
	}()
	return func() int64 { close(done); return <-out }
}

// fillTo507 publishes 64 KiB messages to topic through n until refused
// with 507 (several times), and returns how many were acknowledged and the
// last refusal.
func fillTo507(ctx context.Context, t *testing.T, n *tc.Node, topic string) (int, *tc.Response) {
	t.Helper()
	payload := make([]byte, 64<<10)
	acked, refused := 0, 0
	var last *tc.Response
	for i := 0; i < 8000 && refused < 5; i++ {
		if ctx.Err() != nil {
			t.Fatalf("filling %s: %v after %d acknowledged", topic, ctx.Err(), acked)
		}
		key := fmt.Sprintf("%s-%05d", topic, i)
		copy(payload, key)
		_, r, err := n.Publish(ctx, topic, payload, map[string]string{"Idempotency-Key": key})
		switch {
		case err == nil:
			acked++
		case r != nil && r.Status == 507:
			refused++
			last = r
			time.Sleep(50 * time.Millisecond)
		case tc.Retryable(err):
			time.Sleep(100 * time.Millisecond)
		default:
			t.Fatalf("publish %s: %v (after %d acknowledged)", key, err, acked)
		}
	}
	if refused == 0 {
		t.Fatalf("the disk never got low: %d acknowledged", acked)
	}
	return acked, last
}

// diskMetric reads an unlabelled gauge or counter from n's /metrics.
func diskMetric(ctx context.Context, t *testing.T, n *tc.Node, name string) float64 {
	t.Helper()
	var v float64
	if err := systest.WaitMetric(ctx, n, name, func(f float64) bool { v = f; return true }); err != nil {
		t.Fatal(err)
	}
	return v
}

// The free-disk floor counts the node's own next snapshot: a 256 MiB volume
// with --min-free-disk 32MiB is filled until 507 with no snapshot taken
// (--snapshot-interval 1h), then the node restarts with snapshots on (1s)
// and takes one of the whole state at once (the log since the last
// snapshot is the whole state); free space, sampled every 2 ms across it
// all, never goes under the 32 MiB. Before, the floor counted one 64 MiB
// wal segment only, and the node's own snapshot took free space from
// 96 MiB to 24 or to 0 ("failed to take snapshot: no space left on
// device").
//
// With data groups the state is the topic's group's, under groups/<id>/.
func TestDiskFloorCountsSnapshot(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, diskFloorCountsSnapshot)
}

func diskFloorCountsSnapshot(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 1, append(opts, withTmpfs(t, 256<<20), tc.WithFlags("--min-free-disk", "32MiB", "--snapshot-interval", "1h"))...)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 180*time.Second)
	tc.MustTopic(t, n, "floor", map[string]any{"max_message_bytes": 1 << 20})
	series := func(name string) string { return name + `{raft_group="` + systest.TopicGroup(t, n, "floor") + `"}` }
	stop := minFreeSampler(t, n.DataDir())
	acked, _ := fillTo507(ctx, t, n, "floor")
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	args := n.Args()
	for i, a := range args {
		if a == "1h" {
			args[i] = "1s"
		}
	}
	n.SetArgs(args)
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := systest.WaitMetric(wctx, n, series("mqd_raft_snapshots_total"), func(v float64) bool { return v > 0 }); err != nil {
		t.Fatalf("no snapshot after the restart: %v", err)
	}
	least := stop()
	size := diskMetric(ctx, t, n, series("mqd_raft_snapshot_bytes"))
	t.Logf("%d acknowledged; snapshot of %.0f MiB; least free %d MiB", acked, size/(1<<20), least>>20)
	if size < 32<<20 {
		t.Fatalf("snapshot of %v bytes: not the nearly full state, the test did not exercise the case", size)
	}
	if least < 32<<20 {
		t.Fatalf("free space went down to %d bytes, under --min-free-disk 32MiB", least)
	}
	if !n.Running() {
		t.Fatal("node exited")
	}
}

// emptyAndDelete consumes every message of topic (group g), then deletes
// the topic, through n.
func emptyAndDelete(ctx context.Context, t *testing.T, n *tc.Node, topic string, want int) {
	t.Helper()
	msgs, err := tc.Drain(ctx, n, topic, "g", time.Second)
	if err != nil {
		t.Fatalf("drain %s with the disk low: %v", topic, err)
	}
	if len(systest.DistinctByPosition(msgs)) < want {
		t.Fatalf("drained %d of %d acknowledged messages", len(systest.DistinctByPosition(msgs)), want)
	}
	r, err := n.Do(ctx, http.MethodDelete, "/v1/topics/"+topic, nil, nil)
	systest.ExpectCode(t, "delete topic with the disk low", r, err, 200, "")
}

// A disk filled with messages that are then consumed and their topic
// deleted gives the space back: writes resume without a restart (the
// state file is compacted at the snapshot the low disk calls for) and
// after one. Before, fsm.db and the snapshots never shrank and the node
// answered 507 for good, restarts included.
func TestDiskFreedWritesResume(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, withTmpfs(t, 256<<20), tc.WithFlags("--min-free-disk", "32MiB", "--snapshot-interval", "1s"))
	n := c.Node(0)
	ctx := tc.CtxFor(t, 240*time.Second)
	tc.MustTopic(t, n, "big", map[string]any{"max_message_bytes": 1 << 20})
	tc.MustTopic(t, n, "small", nil)
	acked, _ := fillTo507(ctx, t, n, "big")
	emptyAndDelete(ctx, t, n, "big", acked)
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := publishRetry507(rctx, n, "small", "resumed"); err != nil {
		t.Fatalf("publish after consuming and deleting everything, free %d MiB: %v", freeBytes(t, n.DataDir())>>20, err)
	}
	t.Logf("%d acknowledged, consumed and deleted; writes resumed with %d MiB free", acked, freeBytes(t, n.DataDir())>>20)
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := publishRetry507(rctx, n, "small", "after-restart"); err != nil {
		t.Fatalf("publish after a restart: %v", err)
	}
}

// A follower whose disk filled with data that was then consumed and
// deleted stops blocking the cluster's writes: it compacts its own state
// at the snapshot its low disk calls for, its status stops saying
// disk_low, and the leader, which learns it from its probes, accepts
// writes again. Before, the follower's fsm.db and snapshots kept their
// size, so it stayed under its floor and the leader refused all writes
// for good. With data groups, a follower in the group of the topic that
// fills the disk.
func TestFollowerDiskFreedStopsBlocking(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, followerDiskFreedStopsBlocking)
}

func followerDiskFreedStopsBlocking(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 3, append(opts, withTmpfs(t, 256<<20), tc.WithFlags("--min-free-disk", "16MiB", "--snapshot-interval", "1s"))...)
	ctx := tc.CtxFor(t, 300*time.Second)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "big", map[string]any{"max_message_bytes": 1 << 20})
	tc.MustTopic(t, leader, "small", nil)
	if systest.TopicGroup(t, leader, "big") != "default" {
		leader, followers = systest.PlacedRoles(t, c, "big")
	}
	f := followers[0]
	// A ballast of nearly half its volume makes this follower the first
	// member to get low.
	ballast, err := os.Create(filepath.Join(f.DataDir(), "ballast"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fallocate(int(ballast.Fd()), 0, 0, 112<<20); err != nil {
		t.Fatalf("fallocate: %v", err)
	}
	ballast.Close()
	acked, r := fillTo507(ctx, t, leader, "big")
	if !strings.Contains(string(r.Body), "member "+f.ID()) {
		t.Fatalf("507 does not name the follower %s: %s", f.ID(), r.Body)
	}
	emptyAndDelete(ctx, t, leader, "big", acked)
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if _, err := publishRetry507(rctx, leader, "small", "resumed"); err != nil {
		t.Fatalf("publish after consuming and deleting everything, %s has %d MiB free: %v", f, freeBytes(t, f.DataDir())>>20, err)
	}
	t.Logf("%d acknowledged until %s was low, consumed and deleted; writes resumed, it has %d MiB free", acked, f, freeBytes(t, f.DataDir())>>20)
}

// fillDisk takes every free byte of dir's filesystem with a ballast file.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "ballast"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, freeBytes(t, dir)); err != nil {
		t.Fatalf("fallocate: %v", err)
	}
	if free := freeBytes(t, dir); free != 0 {
		t.Fatalf("%d bytes still free", free)
	}
}

// A cleanly stopped node whose disk is then full to the last byte starts,
// becomes ready and serves reads (and still refuses writes that add data,
// 507). Before, it could not start ("write fsm.db.state.tmp: no space
// left on device").
func TestDiskFullStartServesReads(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, withTmpfs(t, 128<<20))
	n := c.Node(0)
	ctx := tc.CtxFor(t, 120*time.Second)
	tc.MustTopic(t, n, "full", nil)
	for i := range 20 {
		tc.MustPublish(t, n, "full", fmt.Sprintf("m%d", i), nil)
	}
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, n.DataDir())
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatalf("not ready on a full disk: %v", err)
	}
	st, err := n.Stats(ctx, "full")
	if err != nil || st.NextOffsets() != 20 {
		t.Fatalf("stats on a full disk: %d messages, %v", st.NextOffsets(), err)
	}
	r, err := n.Do(ctx, http.MethodPost, "/v1/topics/full/messages", "x", nil)
	systest.ExpectCode(t, "publish on a full disk", r, err, 507, "insufficient_storage")
	if !n.Running() {
		t.Fatal("node exited on a full disk")
	}
}

// A node starts on a 64 MiB volume (raft-wal's segments are sized to it:
// 4 MiB) and takes writes. Before, raft-wal preallocated a 64 MiB segment
// and the node could not start.
func TestDiskSmallVolumeStarts(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, withTmpfs(t, 64<<20))
	n := c.Node(0)
	tc.MustTopic(t, n, "small", nil)
	tc.MustPublish(t, n, "small", "hello", nil)
	segs, err := filepath.Glob(filepath.Join(n.DataDir(), "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no wal segment: %v", err)
	}
	fi, err := os.Stat(segs[0])
	if err != nil || fi.Size() > 4<<20 {
		t.Fatalf("wal segment %v: %v", fi.Size(), err)
	}
}

// A new node refuses to start where its filesystem cannot hold its first
// raft-wal segment and state files, with one line saying what it needs.
func TestDiskTooSmallRefusesStart(t *testing.T) {
	t.Parallel()
	withTmpfs(t, 1<<20) // skips where mounting is not allowed
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	ctx := tc.CtxFor(t, 30*time.Second)
	cmd := exec.CommandContext(ctx, tc.Binary(t), "--id", "n1", "--data-dir", dir, "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("started on a 1 MiB volume:\n%s", out)
	}
	if !strings.Contains(string(out), "a new node needs at least") {
		t.Fatalf("no clear refusal (%v):\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}
