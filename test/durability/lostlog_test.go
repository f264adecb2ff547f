package durability

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// One node losing the newest entries of its raft log, which its state had
// already applied, loses nothing acknowledged (issue 21, item 4). 100
// publishes are committed on the leader L and the follower F1 while the
// other follower F2 is down; L and F1 are killed; F1's log loses those
// entries (raft-wal: the tail segment's newest frames zeroed; raft-boltdb:
// raft.db replaced by a copy taken before them); F1 and F2 are started,
// then L. F1 must neither vote nor lead until it holds L's log again, so
// that no leader is elected without the entries; then every acknowledged
// message is delivered and the three states are identical. With data
// groups the same happens in the topic's group, whose leader L need not
// lead the cluster.
func TestLostLogTailLosesNothing(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"wal", "bolt"} {
		t.Run(store, func(t *testing.T) { lostLogTail(t, store) })
	}
	t.Run("data-group", func(t *testing.T) { lostLogTail(t, "wal", tc.WithDataGroups()) })
}

// tailLost is a 3-node cluster after the loss: L and F1 killed (L's log and
// F1's state hold the 100 "lost" publishes, F1's log no longer does), F2
// stopped before them; acked holds every acknowledged payload. L, F1 and
// F2 are the roles in the topic's raft group g ("default", or its data
// group's id).
type tailLost struct {
	c         *tc.Cluster
	g         string
	l, f1, f2 *tc.Node
	acked     []string
	applied   uint64 // L's and F1's applied index when killed
}

const lostTopic = "lostlog"

func loseTail(t *testing.T, store string, opts ...tc.Option) *tailLost {
	c := tc.Start(t, 3, append(opts, tc.WithFlags("--raft-log", store))...)
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, lostTopic, map[string]any{"partitions": 1})
	s := &tailLost{c: c, g: systest.TopicGroup(t, l, lostTopic), l: l, f1: fs[0], f2: fs[1]}
	if s.g != "default" {
		s.l, s.f1, s.f2 = systest.GroupRoles(t, c, lostTopic)
		l = s.l
	}
	publish := func(prefix string, n int) {
		for i := range n {
			p := fmt.Sprintf("%s-%03d", prefix, i)
			tc.MustPublish(t, l, lostTopic, p, nil)
			s.acked = append(s.acked, p)
		}
	}
	publish("before", 20)
	systest.WaitSameApplied(t, s.g, l, s.f1, s.f2)
	var raftDB []byte // bolt: F1's log as it was before the 100 publishes
	if store == "bolt" {
		if err := s.f1.Stop(); err != nil {
			t.Fatalf("stop %s: %v", s.f1, err)
		}
		raftDB = systest.MustRead(t, filepath.Join(systest.GroupDir(s.f1, s.g), "raft.db"))
		s.f1.Restart()
		if err := s.f1.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
			t.Fatalf("%s after restart: %v", s.f1, err)
		}
	}
	cut := systest.GroupApplied(t, s.f1, s.g) + 1 // the first entry F1 will lose
	if err := s.f2.Stop(); err != nil {
		t.Fatalf("stop %s: %v", s.f2, err)
	}
	publish("lost", 100) // committed on L and F1
	systest.WaitSameApplied(t, s.g, l, s.f1)
	s.applied = systest.GroupApplied(t, s.f1, s.g)
	l.Kill()
	s.f1.Kill()
	if store == "wal" {
		cutWALTail(t, filepath.Join(systest.GroupDir(s.f1, s.g), "wal"), cut)
	} else if err := os.WriteFile(filepath.Join(systest.GroupDir(s.f1, s.g), "raft.db"), raftDB, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s applied %d; its log now ends before %d", s.f1, s.applied, cut)
	return s
}

func lostLogTail(t *testing.T, store string, opts ...tc.Option) {
	s := loseTail(t, store, opts...)
	c, l, f1, f2, topic := s.c, s.l, s.f1, s.f2, lostTopic
	acked := s.acked
	f1.Restart()
	f2.Restart()
	restricted := publishWhileLeaderDown(t, c, s.g, l, f1, f2, topic, &acked)
	if _, err := c.WaitReady(tc.CtxFor(t, 60*time.Second)); err != nil {
		t.Fatalf("cluster not ready after L's return: %v", err)
	}
	leader := tc.MustLeader(t, c)
	for i := range 20 {
		p := fmt.Sprintf("final-%03d", i)
		if _, err := systest.PublishRetry(tc.CtxFor(t, 30*time.Second), []*tc.Node{leader}, topic, p); err != nil {
			t.Fatal(err)
		}
		acked = append(acked, p)
	}
	checkDelivered(t, leader, topic, acked)
	if s.g == "default" {
		systest.CompareStates(t, c)
	} else {
		systest.CompareStateFiles(t, c.Nodes(), filepath.Join("groups", s.g, "fsm.db"))
	}
	if !restricted {
		t.Errorf("%s never answered /readyz 503 saying it does not vote after losing its log's tail", f1)
	}
	if _, err := os.Stat(filepath.Join(systest.GroupDir(f1, s.g), "lost-entries")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still records lost entries after catching up: %v", f1, err)
	}
}

// publishWhileLeaderDown publishes 100 messages with F1 and F2 up and L
// down, starting L once F1 says it does not vote (none can be acked before
// L returns) or once they were all acked (a leader was elected without the
// lost entries). It reports whether F1 said so.
func publishWhileLeaderDown(t *testing.T, c *tc.Cluster, g string, l, f1, f2 *tc.Node, topic string, acked *[]string) bool {
	done := make(chan error, 1)
	var after []string
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		for i := range 100 {
			p := fmt.Sprintf("after-%03d", i)
			if _, err := systest.PublishRetry(ctx, []*tc.Node{f1, f2}, topic, p); err != nil {
				done <- err
				return
			}
			after = append(after, p)
		}
		done <- nil
	}()
	restricted := false
	deadline := time.After(60 * time.Second)
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-deadline:
			t.Fatalf("neither a leader among %s, %s nor %s saying it does not vote within 60 s", f1, f2, f1)
		case <-time.After(100 * time.Millisecond):
		}
		r, rerr := f1.Do(tc.CtxFor(t, 5*time.Second), "GET", "/readyz", nil, nil)
		if rerr == nil && r.Status == 503 && strings.Contains(string(r.Body), "not voting") {
			t.Logf("%s /readyz: %s", f1, r.Body)
			m, merr := f1.Do(tc.CtxFor(t, 5*time.Second), "GET", "/metrics", nil, nil)
			if merr != nil || !strings.Contains(string(m.Body), "\nmqd_raft_vote_restricted{raft_group=\""+g+"\"} 1\n") {
				t.Errorf("%s /metrics does not say mqd_raft_vote_restricted 1 (err %v)", f1, merr)
			}
			restricted = true
			break wait
		}
	}
	l.Restart()
	if err == nil && restricted {
		err = <-done
	}
	if err != nil {
		t.Fatalf("publishing with L down, then back: %v", err)
	}
	*acked = append(*acked, after...)
	return restricted
}

// checkDelivered drains the topic through n and checks every acked payload
// is among the messages.
func checkDelivered(t *testing.T, n *tc.Node, topic string, acked []string) {
	t.Helper()
	msgs, err := tc.Drain(tc.CtxFor(t, 60*time.Second), n, topic, "check", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, v := range systest.Values(t, msgs) {
		got[v] = true
	}
	var missing []string
	for _, p := range acked {
		if !got[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d acked, %d delivered; %d acked messages never delivered, e.g. %v", len(acked), len(msgs), len(missing), missing[:min(5, len(missing))])
	}
}

func mustCluster(t *testing.T, n *tc.Node) tc.ClusterInfo {
	t.Helper()
	ci, err := n.Cluster(tc.CtxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("%s /v1/cluster: %v", n, err)
	}
	return ci
}

// cutWALTail zeroes raft-wal's tail segment from the frame of entry index
// from on, as storage that lost its newest writes would leave it: at open
// raft-wal keeps entries up to the last valid commit frame before it.
// Segment layout (raft-wal v0.4.0 segment/format.go): a 32-byte header
// with the base index at bytes 8-16, then 8-byte-aligned frames, each with
// an 8-byte header (type, 3 reserved, length; commit frames carry a CRC
// there and no payload).
func cutWALTail(t *testing.T, dir string, from uint64) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no wal segment in %s: %v", dir, err)
	}
	sort.Strings(segs) // named by base index, zero-padded
	path := segs[len(segs)-1]
	b := systest.MustRead(t, path)
	base := binary.LittleEndian.Uint64(b[8:16])
	if from < base {
		t.Fatalf("entry %d is before the tail segment %s (base %d)", from, path, base)
	}
	idx, start, off := base, -1, 32
	for off+8 <= len(b) && b[off] != 0 {
		typ, size := b[off], 8
		if typ != 3 { // entry or index frame: a payload, padded to 8 bytes
			n := int(binary.LittleEndian.Uint32(b[off+4 : off+8]))
			size += (n + 7) &^ 7
		}
		if typ == 1 {
			if idx == from {
				start = off
			}
			idx++
		}
		off += size
	}
	if start < 0 {
		t.Fatalf("entry %d not in %s (entries %d to %d)", from, path, base, idx-1)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, off-start), int64(start)); err != nil {
		t.Fatal(err)
	}
	t.Logf("zeroed %s from byte %d to %d (entries %d to %d)", filepath.Base(path), start, off, from, idx-1)
}

// A one-node cluster whose raft log lost entries its state applied elects
// itself without anyone's vote: it must then serve nothing (every write
// would land at an index its state skips) and say why. The code before
// answered /readyz 200 and failed every write with 503 "no result" (its
// state skipped them) until the log passed the state's index. No other
// node holds the lost entries, but the state does: the operator's way out
// (docs/operations.md) is a backup of it restored as a new cluster, which
// holds every acknowledged message.
// With data groups the topic's group (one replica) is the one that lost them.
func TestLostLogTailSingleNodeServesNothing(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, lostLogTailSingleNode)
}

func lostLogTailSingleNode(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 1, opts...)
	n := tc.MustLeader(t, c)
	const topic = "lostlog1"
	tc.MustTopic(t, n, topic, map[string]any{"partitions": 1})
	g := systest.TopicGroup(t, n, topic)
	var acked []string
	for i := range 40 {
		p := fmt.Sprintf("m-%03d", i)
		tc.MustPublish(t, n, topic, p, nil)
		acked = append(acked, p)
	}
	cut := systest.GroupApplied(t, n, g) - 29 // the last 30 publishes
	n.Kill()
	cutWALTail(t, filepath.Join(systest.GroupDir(n, g), "wal"), cut)
	n.Restart()
	ctx := tc.CtxFor(t, 30*time.Second)
	restricted := false
	for !restricted {
		r, err := n.Do(ctx, "GET", "/readyz", nil, nil)
		if err == nil && r.Status == 200 {
			break
		}
		restricted = err == nil && strings.Contains(string(r.Body), "not voting")
		if !restricted && ctx.Err() != nil {
			t.Fatalf("neither ready nor saying it does not vote within 30 s: %v", err)
		}
		if !restricted {
			time.Sleep(50 * time.Millisecond)
		}
	}
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, _, err := n.Publish(pctx, topic, []byte("after"), map[string]string{"Mq-Timeout-Ms": "2000"})
	if restricted {
		if err == nil {
			t.Fatalf("acknowledged a publish (offset %d) while its state is ahead of its log", pr.Offset)
		}
		if r, err := n.Do(tc.CtxFor(t, 5*time.Second), "GET", "/readyz", nil, nil); err != nil || r.Status != 503 {
			t.Fatalf("/readyz after the refused publish: %v %v", r, err)
		}
		restoreLost(t, n, g, topic, acked)
		return
	}
	t.Errorf("%s answered /readyz 200 with its state ahead of its log", n)
	if err != nil {
		t.Fatalf("publish after the restart: %v", err)
	}
	msgs, err := tc.Drain(tc.CtxFor(t, 30*time.Second), n, topic, "check", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(systest.Values(t, msgs), "after") {
		t.Errorf("acknowledged publish \"after\" (offset %d) never delivered (%d delivered)", pr.Offset, len(msgs))
	}
}

// restoreLost takes a backup of n's state, restores it as a new one-node
// cluster and checks it delivers every acked message.
func restoreLost(t *testing.T, n *tc.Node, g, topic string, acked []string) {
	t.Helper()
	// The state was rolled back to its checkpoint at open (it stopped
	// uncleanly), so the acknowledged entries its log lost are in the copy
	// of the live fsm.db it kept before the rollback (evidence.go).
	copies, err := filepath.Glob(filepath.Join(systest.GroupDir(n, g), "fsm.db.lost-*"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("the restricted node kept %d copies of its live fsm.db (%v), want 1", len(copies), err)
	}
	file := copies[0]
	n.Kill()
	rc := tc.Start(t, 1, tc.WithNodeArgs(func(rn *tc.Node) []string {
		if out, err := systest.RunMqd(t, "restore", "--data-dir", rn.DataDir(), "--id", rn.ID(), "--raft-addr", rn.RaftAddr(), file); err != nil {
			t.Fatalf("mqd restore: %v\n%s", err, out)
		}
		return nil
	}))
	checkDelivered(t, tc.MustLeader(t, rc), topic, acked)
}

// TestConflictAtAppliedIndexRefused: a node that lost entries without
// knowing it (F1's state is gone with its log's tail, so nothing says it
// had applied them) lets F1 and F2 elect a leader without them, which
// writes other entries at those indexes. Two of three nodes lacking
// acknowledged entries is beyond what mqd promises; but L, whose state
// applied the originals, must not clear them from its log and skip the
// new ones silently, as it did before (and answered /readyz 200 with a
// state no other node has). It refuses to clear them, keeps its log and
// state as evidence, and says for good that it differs; the others keep
// serving. With data groups the same holds in the topic's group.
func TestConflictAtAppliedIndexRefused(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, conflictAtAppliedIndex)
}

func conflictAtAppliedIndex(t *testing.T, opts ...tc.Option) {
	s := loseTail(t, "wal", opts...)
	for _, f := range []string{"fsm.db", "fsm.db.state"} {
		if err := os.Remove(filepath.Join(systest.GroupDir(s.f1, s.g), f)); err != nil {
			t.Fatal(err)
		}
	}
	s.f1.Restart()
	s.f2.Restart()
	leader, err := s.c.Leader(tc.CtxFor(t, 60*time.Second))
	if err != nil {
		t.Fatalf("F1 and F2 elect no leader: %v", err)
	}
	for i := range 100 {
		if _, err := systest.PublishRetry(tc.CtxFor(t, 30*time.Second), []*tc.Node{leader}, lostTopic, fmt.Sprintf("other-%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	commit := systest.GroupCommit(t, []*tc.Node{s.f1, s.f2}, s.g)
	s.l.Restart()
	ctx := tc.CtxFor(t, 60*time.Second)
	for {
		r, err := s.l.Do(ctx, "GET", "/readyz", nil, nil)
		if err == nil && r.Status == 503 && strings.Contains(string(r.Body), "for good") {
			t.Logf("%s /readyz: %s", s.l, r.Body)
			break
		}
		if err == nil && r.Status == 200 && systest.GroupApplied(t, s.l, s.g) >= commit {
			t.Fatalf("%s answered /readyz 200 after the leader's log replaced entries its state had applied (its state skipped the new ones)", s.l)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never said it differs for good: %v", s.l, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its state opened at its checkpoint (it was killed) and applies
	// nothing from the conflicting leader: at most where it was.
	if got := systest.GroupApplied(t, s.l, s.g); got > s.applied {
		t.Errorf("%s applied index %d, past its own %d: it applied the conflicting leader's entries", s.l, got, s.applied)
	}
	m, err := s.l.Do(tc.CtxFor(t, 5*time.Second), "GET", "/metrics", nil, nil)
	if err != nil || !strings.Contains(string(m.Body), "\nmqd_raft_vote_restricted{raft_group=\""+s.g+"\"} 1\n") {
		t.Errorf("%s /metrics does not say mqd_raft_vote_restricted 1 (err %v)", s.l, err)
	}
	if b := systest.MustRead(t, filepath.Join(systest.GroupDir(s.l, s.g), "lost-entries")); !strings.Contains(string(b), `"diverged":true`) {
		t.Errorf("%s lost-entries: %s", s.l, b)
	}
	if _, err := systest.PublishRetry(tc.CtxFor(t, 30*time.Second), []*tc.Node{leader}, lostTopic, "still-serving"); err != nil {
		t.Errorf("F1 and F2 stopped serving: %v", err)
	}
}
