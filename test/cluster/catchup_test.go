package cluster

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// catchUpRSSBound is the documented bound (docs/reliability.md, "Catch-up
// memory") on a wiped follower's anonymous resident memory while it
// catches up from entries of 1 MiB (batch publishes), whatever the
// state's size: the snapshot streams to disk and into fsm.db, and the log
// after it comes at most 64 entries (here 64 MiB) per AppendEntries,
// which raft-wal buffers whole (about four copies live at once, and the
// garbage collector's headroom).
const catchUpRSSBound = 768 << 20

// memSampler samples a process's RssAnon and RssFile every 20 ms until
// stopped, and returns the highest of each.
func memSampler(pid int) (stop func() (anon, file int64)) {
	done := make(chan struct{})
	res := make(chan [2]int64, 1)
	go func() {
		var peak [2]int64
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := systest.StatusKB(pid, "RssAnon"); err == nil {
				peak[0] = max(peak[0], v)
			}
			if v, err := systest.StatusKB(pid, "RssFile"); err == nil {
				peak[1] = max(peak[1], v)
			}
			select {
			case <-done:
				res <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() (int64, int64) { close(done); p := <-res; return p[0], p[1] }
}

// A follower whose data dir was wiped catches up from a leader holding
// MQD_CATCHUP_MB (default 128) MiB of messages — a snapshot, then the log
// after it — with its anonymous resident memory under catchUpRSSBound.
// They are published as 1 MiB batches (entries of 1 MiB), or, with
// MQD_CATCHUP_SINGLE set, one 64 KiB message at a time.
// The measurement and its scaling are in docs/reliability.md.
func TestCatchUpBoundedMemory(t *testing.T) {
	mb := 128
	if v, err := strconv.Atoi(os.Getenv("MQD_CATCHUP_MB")); err == nil && v > 0 {
		mb = v
	}
	c := tc.Start(t, 3, tc.WithFlags("--snapshot-interval", "2s", "--pprof"))
	// Bounded well inside the package's test timeout, so that a follower
	// that does not catch up fails this test with the nodes' logs rather
	// than the whole package (it catches up in seconds).
	wait := 180 * time.Second
	if v, err := strconv.Atoi(os.Getenv("MQD_CATCHUP_WAIT_S")); err == nil && v > 0 {
		wait = time.Duration(v) * time.Second // to reproduce a hang sooner
	}
	ctx := tc.CtxFor(t, wait)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "bulk", map[string]any{"max_message_bytes": 1 << 20})
	val := strings.Repeat("x", 64<<10)
	batch := make([]map[string]any, 16) // 1 MiB a request
	for i := range batch {
		batch[i] = map[string]any{"value": val}
	}
	single := os.Getenv("MQD_CATCHUP_SINGLE") != "" // 64 KiB publishes: entries of 64 KiB
	for i := 0; i < mb; i++ {
		if single {
			for range batch {
				tc.MustPublish(t, leader, "bulk", val, nil)
			}
			continue
		}
		r, err := leader.Do(ctx, http.MethodPost, "/v1/topics/bulk/messages:batch", map[string]any{"messages": batch}, nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("batch %d: %v %v", i, r, err)
		}
	}
	f := followers[0]
	if err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	f.Wipe()
	want := clusterInfo(ctx, t, leader).AppliedIndex
	start := time.Now()
	f.Restart()
	stop := memSampler(f.PID())
	for {
		if ci, err := f.Cluster(ctx); err == nil && ci.AppliedIndex >= want {
			break
		}
		select {
		case <-ctx.Done():
			// Where the follower's catch-up and the leader's replication
			// to it stand, for the log: the follower first, and only the
			// goroutines of raft, its transport and the state machine
			// (CI keeps only part of a long output).
			for _, n := range []*tc.Node{f, leader} {
				dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if r, err := n.Do(dctx, http.MethodGet, "/debug/pprof/goroutine?debug=2", nil, nil); err == nil {
					t.Logf("%s's goroutines (%s):\n%s", n.ID(), map[bool]string{true: "leader", false: "the wiped follower"}[n == leader],
						raftStacks(string(r.Body)))
				}
				cancel()
			}
			t.Fatalf("follower did not catch up to %d: %v", want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	took := time.Since(start)
	anon, file := stop()
	hwm, err := systest.StatusKB(f.PID(), "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("caught up with %d MiB of messages in %v: peak RssAnon %d MiB, peak RssFile %d MiB, VmHWM %d MiB",
		mb, took.Round(100*time.Millisecond), anon>>20, file>>20, hwm>>20)
	if anon > catchUpRSSBound {
		t.Errorf("peak anonymous RSS %d MiB, over the documented bound of %d MiB", anon>>20, catchUpRSSBound>>20)
	}
}

// raftStacks keeps the goroutines of a debug=2 dump that run raft, its
// transport, the replica or the state machine.
func raftStacks(dump string) string {
	var keep []string
	for _, g := range strings.Split(dump, "\n\n") {
		for _, pkg := range []string{"hashicorp/raft", "mqd/replica", "mqd/fsm", "mqd/internal/raftmux", "bbolt"} {
			if strings.Contains(g, pkg) {
				keep = append(keep, g)
				break
			}
		}
	}
	return strings.Join(keep, "\n\n")
}

func clusterInfo(ctx context.Context, t *testing.T, n *tc.Node) tc.ClusterInfo {
	t.Helper()
	ci, err := n.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ci
}
