package replica

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// groupSet is one group's three replicas, one per node, each on its own
// TCP transport.
type groupSet struct {
	id   string
	reps []*Group
	stop []func()
}

// openGroupSet opens and bootstraps group id on the nodes' data dirs.
func openGroupSet(t *testing.T, ctx context.Context, id string, dataDirs []string) *groupSet {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	s := &groupSet{id: id}
	var servers []raft.Server
	var trans []*raft.NetworkTransport
	for i := range dataDirs {
		tr, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 3, 10*time.Second, NewHclog(logger, "raft"))
		if err != nil {
			t.Fatal(err)
		}
		trans = append(trans, tr)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprintf("n%d", i+1)), Address: tr.LocalAddr()})
	}
	for i, dataDir := range dataDirs {
		dir, err := GroupDir(dataDir, id)
		if err != nil {
			t.Fatal(err)
		}
		g, err := OpenGroup(GroupConfig{ID: id, NodeID: string(servers[i].ID), Dir: dir, Transport: trans[i],
			LogStore: LogStoreWAL, WALSegment: 1 << 20, SnapshotThreshold: 5, SnapshotInterval: 50 * time.Millisecond,
			TrailingLogs: 2, Logger: logger})
		if err != nil {
			t.Fatalf("open %s on n%d: %v", id, i+1, err)
		}
		if err := g.Bootstrap(servers); err != nil {
			t.Fatalf("bootstrap %s: %v", id, err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); g.Run(rctx) }()
		s.reps = append(s.reps, g)
		s.stop = append(s.stop, sync1(t, g, cancel, done))
	}
	t.Cleanup(func() {
		for _, stop := range s.stop {
			stop()
		}
	})
	return s
}

// sync1 returns a stop for one replica that runs once: end Run, then
// Shutdown.
func sync1(t *testing.T, g *Group, cancel func(), done chan struct{}) func() {
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		if err := g.Shutdown(); err != nil {
			t.Errorf("shutdown %s: %v", g.ID(), err)
		}
	}
}

// until polls cond every 10 ms until it holds or ctx ends.
func until(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if Pause(ctx, 10*time.Millisecond) != nil {
			t.Fatalf("%s: %v", what, ctx.Err())
		}
	}
}

// leader waits for a serving leader among the running replicas.
func (s *groupSet) leader(t *testing.T, ctx context.Context, skip *Group) *Group {
	t.Helper()
	var l *Group
	until(t, ctx, s.id+": a serving leader", func() bool {
		for _, g := range s.reps {
			if g != skip && g.Serving() {
				l = g
				return true
			}
		}
		return false
	})
	return l
}

// putTopics creates topics prefix-0 .. prefix-(k-1) through the leader.
func putTopics(t *testing.T, ctx context.Context, l *Group, prefix string, from, k int) {
	t.Helper()
	for i := from; i < from+k; i++ {
		c := &command.Command{Op: command.OpPutTopic, Now: time.Now().UnixMilli(), Topic: fmt.Sprintf("%s-%d", prefix, i)}
		if _, err := l.Apply(ctx, c); err != nil {
			t.Fatalf("%s: put topic: %v", l.ID(), err)
		}
	}
}

// topics lists the topics a replica's state holds.
func topics(t *testing.T, g *Group) []string {
	t.Helper()
	var out []string
	if err := g.FSM().Read(func(r *fsm.Reader) error {
		r.EachTopicAfter("", func(name string) bool { out = append(out, name); return true })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// Two groups on the same three nodes, in one process, each on its own TCP
// transports and in its own directory under each node's data dir: each
// elects, applies and snapshots on its own, and their metrics register
// side by side in one registry under their own raft_group. Groups sharing
// a directory would see each other's topics (or not open); sharing metric
// series would fail the registration or give one applied index.
func TestTwoGroupsIndependent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dataDirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	alpha := openGroupSet(t, ctx, "alpha", dataDirs)
	beta := openGroupSet(t, ctx, "beta", dataDirs)

	la, lb := alpha.leader(t, ctx, nil), beta.leader(t, ctx, nil)
	putTopics(t, ctx, la, "a", 0, 12)
	putTopics(t, ctx, lb, "b", 0, 6)
	for _, s := range []*groupSet{alpha, beta} {
		for _, g := range s.reps {
			until(t, ctx, s.id+": every replica applied and snapshotted", func() bool {
				return len(topics(t, g)) == map[string]int{"alpha": 12, "beta": 6}[s.id] && g.LastSnapshotIndex() > 0
			})
			for _, name := range topics(t, g) {
				if name[0] != s.id[0] {
					t.Fatalf("group %s on %s holds topic %s of the other group", s.id, g.cfg.NodeID, name)
				}
			}
			if _, err := os.Stat(filepath.Join(g.Dir(), "fsm.db")); err != nil || filepath.Base(g.Dir()) != s.id {
				t.Fatalf("group %s's state is not in its own directory %s: %v", s.id, g.Dir(), err)
			}
		}
	}

	// Metrics: both groups of node 1 in one registry, each series its own.
	reg := prometheus.NewRegistry()
	for _, g := range []*Group{alpha.reps[0], beta.reps[0]} {
		for _, c := range g.Collectors() {
			if err := reg.Register(c); err != nil {
				t.Fatalf("register %s's collectors beside the other group's: %v", g.ID(), err)
			}
		}
	}
	applied := gauges(t, reg, "mqd_raft_applied_index")
	for _, g := range []*Group{alpha.reps[0], beta.reps[0]} {
		if v, ok := applied[g.ID()]; !ok || uint64(v) != g.AppliedIndex() {
			t.Errorf("mqd_raft_applied_index{raft_group=%q} = %v (present %v), want %d", g.ID(), v, ok, g.AppliedIndex())
		}
	}
	if applied["alpha"] == applied["beta"] {
		t.Errorf("both groups report applied index %v: one series for two groups", applied["alpha"])
	}
	if snaps := gauges(t, reg, "mqd_raft_snapshots_total"); snaps["alpha"] < 1 || snaps["beta"] < 1 {
		t.Errorf("mqd_raft_snapshots_total by raft_group = %v, want each at least 1", snaps)
	}

	// Only beta writes: beta snapshots again, alpha does not. (Alpha first
	// settles: fewer entries past its snapshot than the threshold, 5, so
	// that no snapshot of what it applied before is still to come.)
	until(t, ctx, "alpha settles", func() bool {
		g := alpha.reps[0]
		return g.AppliedIndex()-g.LastSnapshotIndex() < 5
	})
	alphaSnap, alphaTerm := alpha.reps[0].LastSnapshotIndex(), la.raft.CurrentTerm()
	betaSnap := beta.reps[0].LastSnapshotIndex()
	putTopics(t, ctx, lb, "b", 6, 6)
	until(t, ctx, "beta snapshots again", func() bool { return beta.reps[0].LastSnapshotIndex() > betaSnap })
	if got := alpha.reps[0].LastSnapshotIndex(); got != alphaSnap {
		t.Errorf("alpha's snapshot moved from %d to %d while only beta wrote", alphaSnap, got)
	}

	// Alpha's leader stops: alpha elects another; beta's term does not move.
	betaTerm := lb.raft.CurrentTerm()
	for i, g := range alpha.reps {
		if g == la {
			alpha.stop[i]()
		}
	}
	nla := alpha.leader(t, ctx, la)
	if nla.raft.CurrentTerm() <= alphaTerm {
		t.Errorf("alpha's new leader is at term %d, not past %d", nla.raft.CurrentTerm(), alphaTerm)
	}
	putTopics(t, ctx, nla, "a", 12, 1)
	putTopics(t, ctx, lb, "b", 12, 1)
	if !lb.Serving() || lb.raft.CurrentTerm() != betaTerm {
		t.Errorf("beta's leader: serving %v, term %d (was %d) after alpha's leader stopped", lb.Serving(), lb.raft.CurrentTerm(), betaTerm)
	}
}

// gauges gathers reg and answers family name's values by raft_group.
func gauges(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[label(m, GroupLabel)] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// The default group lives in the data dir itself (existing data dirs open
// unchanged); another under groups/<id>/; a bad id names no directory.
func TestGroupDir(t *testing.T) {
	data := t.TempDir()
	if d, err := GroupDir(data, DefaultGroup); err != nil || d != data {
		t.Fatalf("default group dir %q, %v; want the data dir %q", d, err, data)
	}
	d, err := GroupDir(data, "meta")
	if want := filepath.Join(data, "groups", "meta"); err != nil || d != want {
		t.Fatalf("group dir %q, %v; want %q", d, err, want)
	}
	if st, err := os.Stat(d); err != nil || !st.IsDir() {
		t.Fatalf("group dir not made: %v", err)
	}
	for _, bad := range []string{"", "../x", "A", "a/b", string(make([]byte, 65))} {
		if _, err := GroupDir(data, bad); err == nil {
			t.Errorf("GroupDir(%q) accepted", bad)
		}
	}
}
