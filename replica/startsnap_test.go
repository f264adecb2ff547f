package replica

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The state's start point is listed only while offered (inside NewRaft),
// and is never opened as a snapshot of its own: opening it opens the
// latest real snapshot, or fails when there is none.
func TestStartPointListedOnlyWhileOffered(t *testing.T) {
	inner := raft.NewInmemSnapshotStore()
	s := &stateSnapshots{SnapshotStore: inner, point: &startPoint{meta: raft.SnapshotMeta{ID: "mqd-state-9", Index: 9, Term: 2}}}
	s.offering.Store(true)
	if _, _, err := s.Open("mqd-state-9"); err == nil {
		t.Fatal("opening the start point without a real snapshot succeeded")
	}
	sink, err := inner.Create(raft.SnapshotVersionMax, 5, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state at 5")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != "mqd-state-9" || list[1].Index != 5 {
		t.Fatalf("offered: List = %v %v, want the start point, then the snapshot at 5", list, err)
	}
	meta, rc, err := s.Open("mqd-state-9")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if meta.Index != 5 || string(b) != "state at 5" {
		t.Fatalf("opening the start point gave index %d %q, want the real snapshot at 5", meta.Index, b)
	}
	s.offering.Store(false)
	if list, err := s.List(); err != nil || len(list) != 1 || list[0].Index != 5 {
		t.Fatalf("after NewRaft: List = %v %v, want the real snapshot only", list, err)
	}
}

// A replica that caught up from a snapshot (its log starts right after it)
// and restarted from its state's start point leads; a new member it adds
// installs that snapshot and then takes the entries after it. Before,
// raft looked the snapshot's own entry up for the term the new member had
// to match (it took the start point for its latest snapshot), did not
// find it, and sent the same snapshot again and again: the new member
// never got past it (seen in the chaos soak as a move that never ended).
func TestNewMemberCatchesUpFromLeaderStartedAtItsState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	logger := slog.New(slog.DiscardHandler)
	type rep struct {
		id      string
		dataDir string
		addr    raft.ServerAddress
		g       *Group
		stop    func()
	}
	open := func(r *rep, servers []raft.Server) {
		t.Helper()
		bind := string(r.addr)
		if bind == "" {
			bind = "127.0.0.1:0"
		}
		tr, err := raft.NewTCPTransportWithLogger(bind, nil, 3, 10*time.Second, NewHclog(logger, "raft"))
		if err != nil {
			t.Fatal(err)
		}
		r.addr = tr.LocalAddr()
		dir, err := GroupDir(r.dataDir, "g")
		if err != nil {
			t.Fatal(err)
		}
		g, err := OpenGroup(GroupConfig{ID: "g", NodeID: r.id, Dir: dir, Transport: tr,
			LogStore: LogStoreWAL, WALSegment: 1 << 20, SnapshotThreshold: 1000, SnapshotInterval: 50 * time.Millisecond,
			TrailingLogs: 2, Logger: logger})
		if err != nil {
			t.Fatalf("open g on %s: %v", r.id, err)
		}
		if servers != nil {
			if err := g.Bootstrap(servers); err != nil {
				t.Fatal(err)
			}
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); g.Run(rctx) }()
		r.g, r.stop = g, sync1(t, g, cancel, done)
		t.Cleanup(r.stop)
	}
	reps := []*rep{{id: "n1", dataDir: t.TempDir()}, {id: "n2", dataDir: t.TempDir()}, {id: "n3", dataDir: t.TempDir()}}
	// Addresses first: every replica bootstraps the same configuration.
	var servers []raft.Server
	for _, r := range reps {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r.addr = raft.ServerAddress(l.Addr().String())
		l.Close()
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(r.id), Address: r.addr})
	}
	for _, r := range reps {
		open(r, servers)
	}
	leaderOf := func(skip *rep) *rep {
		var l *rep
		until(t, ctx, "a leader", func() bool {
			for _, r := range reps {
				if r != skip && r.g != nil && r.g.IsLeader() {
					l = r
					return true
				}
			}
			return false
		})
		return l
	}
	l := leaderOf(nil)
	var r3 *rep
	for _, r := range reps {
		if r != l {
			r3 = r
		}
	}
	// r3 stops; the others snapshot and compact past it, so that it comes
	// back by installing a snapshot: its log then starts right after it.
	r3.stop()
	// (Snapshots are taken here, not by the policy: its threshold is out
	// of reach, so that no replica snapshots on its own.)
	putTopics(t, ctx, l.g, "a", 0, 20)
	if err := l.g.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot on %s: %v", l.id, err)
	}
	open(r3, nil)
	until(t, ctx, r3.id+" installs the snapshot", func() bool {
		return r3.g.AppliedIndex() >= l.g.AppliedIndex() && r3.g.LastSnapshotIndex() > 0
	})
	snap := r3.g.LastSnapshotIndex()
	// Two entries past it, then a restart: raft starts at the state's
	// applied index. (A snapshot of r3's own would put raft's latest
	// snapshot back on a real one: none is taken.)
	putTopics(t, ctx, l.g, "b", 0, 2)
	until(t, ctx, r3.id+" applies them", func() bool { return r3.g.AppliedIndex() >= l.g.AppliedIndex() })
	r3.stop()
	open(r3, nil)
	if r3.g.start == nil || r3.g.start.real != snap {
		t.Fatalf("%s did not start at its state (start point %+v, latest snapshot %d)", r3.id, r3.g.start, snap)
	}
	until(t, ctx, r3.id+" catches up after the restart", func() bool { return r3.g.AppliedIndex() >= l.g.AppliedIndex() })
	// The hand-off may meet a pooled connection to r3's former transport
	// (EOF): it is asked again.
	until(t, ctx, "leadership handed to "+r3.id, func() bool {
		cur := leaderOf(nil)
		if cur == r3 {
			return true
		}
		_ = cur.g.Raft().LeadershipTransferToServer(raft.ServerID(r3.id), r3.addr).Error()
		return false
	})
	// A new member: it installs r3's latest real snapshot, then must take
	// the entries after it.
	r4 := &rep{id: "n4", dataDir: t.TempDir()}
	reps = append(reps, r4)
	open(r4, nil)
	if err := r3.g.Raft().AddNonvoter(raft.ServerID(r4.id), r4.addr, 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	t.Logf("snapshot %d, start point %d, leader applied %d, leader's log from %d", snap, r3.g.start.meta.Index, r3.g.AppliedIndex(), firstIndex(t, r3.g))
	for r4.g.AppliedIndex() < r3.g.AppliedIndex() {
		if Pause(wctx, 10*time.Millisecond) != nil {
			t.Fatalf("the new member applied %d of its leader's %d in 15 s (the leader's latest snapshot is at %d)",
				r4.g.AppliedIndex(), r3.g.AppliedIndex(), snap)
		}
	}
}

func firstIndex(t *testing.T, g *Group) uint64 {
	i, err := g.stores.Log.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	return i
}
