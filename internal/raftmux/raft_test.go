package raftmux_test

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/raftmux"
)

// listFSM records the commands it applies.
type listFSM struct {
	mu  sync.Mutex
	got []string
}

func (f *listFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, string(l.Data))
	return nil
}

func (f *listFSM) applied() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, fmt.Errorf("no snapshots here") }
func (f *listFSM) Restore(io.ReadCloser) error         { return fmt.Errorf("no snapshots here") }

type member struct {
	r   *raft.Raft
	fsm *listFSM
}

func mustRaft(t *testing.T, m *raftmux.Mux, id, group string, peers []raft.Server) member {
	t.Helper()
	tr := mustTransport(t, m, group)
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(id)
	c.HeartbeatTimeout = 300 * time.Millisecond
	c.ElectionTimeout = 300 * time.Millisecond
	c.LeaderLeaseTimeout = 150 * time.Millisecond
	c.Logger = quiet()
	store := raft.NewInmemStore()
	f := &listFSM{}
	r, err := raft.NewRaft(c, f, store, store, raft.NewInmemSnapshotStore(), tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown().Error() })
	if err := r.BootstrapCluster(raft.Configuration{Servers: peers}).Error(); err != nil {
		t.Fatal(err)
	}
	return member{r: r, fsm: f}
}

// Two nodes, one raft port each, two raft groups on both: each group
// elects its own leader and replicates its own log, nothing of the other's.
func TestRaftGroupsShareOnePort(t *testing.T) {
	muxes := []*raftmux.Mux{mustMux(t, raftmux.Config{}), mustMux(t, raftmux.Config{})}
	var peers []raft.Server
	for i, m := range muxes {
		peers = append(peers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: raft.ServerAddress(m.Addr().String()), Suffrage: raft.Voter})
	}
	groups := []string{raftmux.Default, "data-1"}
	members := map[string][]member{}
	for _, g := range groups {
		for i, m := range muxes {
			members[g] = append(members[g], mustRaft(t, m, fmt.Sprint("n", i), g, peers))
		}
	}
	for _, g := range groups {
		leader := waitLeader(t, g, members[g])
		cmd := "cmd-of-" + g
		if err := leader.r.Apply([]byte(cmd), 5*time.Second).Error(); err != nil {
			t.Fatalf("group %q apply: %v", g, err)
		}
		for _, m := range members[g] {
			waitApplied(t, g, m, cmd)
		}
	}
	// A leadership change in one group leaves the other's leader alone.
	metaLeader := waitLeader(t, raftmux.Default, members[raftmux.Default])
	dataLeader := waitLeader(t, "data-1", members["data-1"])
	if err := dataLeader.r.LeadershipTransfer().Error(); err != nil {
		t.Fatalf("data-1 leadership transfer: %v", err)
	}
	if now := waitLeader(t, "data-1", members["data-1"]); now.r == dataLeader.r {
		t.Fatal("data-1 kept its leader through a transfer")
	}
	if now := waitLeader(t, raftmux.Default, members[raftmux.Default]); now.r != metaLeader.r {
		t.Fatal("the default group's leader changed with data-1's")
	}
	for _, g := range groups {
		for i, m := range members[g] {
			if got := m.fsm.applied(); !slices.Equal(got, []string{"cmd-of-" + g}) {
				t.Fatalf("group %q node %d applied %q, want its own group's command only", g, i, got)
			}
		}
	}
}

func waitLeader(t *testing.T, g string, ms []member) member {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range ms {
			if m.r.State() == raft.Leader {
				return m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("group %q elected no leader in 20 s", g)
	return member{}
}

func waitApplied(t *testing.T, g string, m member, cmd string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(m.fsm.applied(), cmd) {
		if time.Now().After(deadline) {
			t.Fatalf("group %q: %q not applied in 10 s (applied %q)", g, cmd, m.fsm.applied())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
