package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/internal/refusal"
	"github.com/mqd/mqd/replica"
)

// Every node asks each other member for its /v1/internal/status every
// probeEvery. The answers say whether the member is reachable (over HTTP,
// the path clients and forwarding use), what state it is in by its own
// account, its raft indexes, and its wall clock, from which this node
// measures the clock offset (clock.go).
const (
	probeEvery   = 500 * time.Millisecond
	probeTimeout = time.Second
	// A member with no answer for this long, or whose latest probe failed,
	// is unreachable.
	probeStale = 3 * probeEvery
)

// ErrNodeNotFound answers a request about a node the cluster does not have.
var ErrNodeNotFound = refusal.New(404, "node_not_found", "node not found")

// peerView is what this node last learned about another member.
type peerView struct {
	status   Status    // the member's latest answer
	lastOK   time.Time // when it answered (local monotonic time)
	failed   bool      // the latest probe failed
	offsetMs int64     // this node's clock minus the member's, measured at lastOK
	rttMs    int64
	// mine: this node's applied index of each data group it holds, read
	// as the probe was sent, so a member's answer is compared with what
	// this node had then (moves.go, caughtUp), not with what it has since.
	mine map[string]uint64
}

// answered reports whether the member's latest probe succeeded, within
// probeStale of now.
func (v *peerView) answered(now time.Time) bool {
	return !v.failed && !v.lastOK.IsZero() && now.Sub(v.lastOK) < probeStale
}

type peers struct {
	mu    sync.Mutex
	views map[string]*peerView
}

// PeerState is one member as this node sees it.
type PeerState struct {
	State         string // leader, follower, candidate, unreachable (or unknown before the first probe)
	LastContactMs int64  // ms since this node last heard from it; -1: never
	AppliedIndex  uint64
	CommitIndex   uint64
	ClockOffsetMs int64 // this node's clock minus the member's
	Reachable     bool
	Probed        bool
	// StateFormatMax: the highest state format its binary reads, by its
	// latest answer (0: a binary older than formats, or no answer yet).
	StateFormatMax int
}

// probeLoop probes every other member until ctx ends.
func (n *Node) probeLoop(ctx context.Context) {
	client := n.peerClient(probeTimeout)
	defer client.CloseIdleConnections()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		n.probeAll(ctx, client)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) probeAll(ctx context.Context, client *http.Client) {
	servers, err := n.Servers()
	if err != nil {
		return
	}
	n.recordID(servers)
	infos := n.FSM.Nodes()
	var wg sync.WaitGroup
	keep := map[string]bool{}
	for _, s := range servers {
		id := string(s.ID)
		keep[id] = true
		addr := infos[id].HTTPAddr
		if id == n.cfg.ID || addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.probe(ctx, client, id, addr)
		}()
	}
	// Members whose HTTP address is not recorded yet (a cluster just
	// formed: the leader records addresses, and must know the clocks
	// before it proposes anything) are found through the --join list.
	known := map[string]bool{n.cfg.HTTPAddr: true}
	for _, s := range servers {
		known[infos[string(s.ID)].HTTPAddr] = true
	}
	if jp, _ := n.joinPeers.Load().([]string); len(jp) > 0 {
		for _, addr := range jp {
			if known[addr] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.probeClock(ctx, client, addr, keep)
			}()
		}
	}
	wg.Wait()
	n.peers.mu.Lock()
	now := time.Now()
	margin := newMarginRound()
	for id, v := range n.peers.views {
		switch {
		case !keep[id]:
			delete(n.peers.views, id)
		case v.answered(now):
			margin.add(id, v.status)
		}
	}
	n.peers.mu.Unlock()
	n.memberDisk.set(margin)
	low := n.memberDisk.low(nil)
	if was, _ := n.lowMember.Swap(low).(string); was != low && n.IsLeader() {
		if low != "" {
			n.logger.Warn("a member is low on disk: refusing writes that add data (507)", "member", low)
		} else if was != "" {
			n.logger.Info("no member low on disk any more: accepting writes", "member", was)
		}
	}
}

func (n *Node) probe(ctx context.Context, client *http.Client, id, addr string) {
	sent := time.Now()
	var mine map[string]uint64
	for gid, g := range n.DataGroups() {
		if mine == nil {
			mine = map[string]uint64{}
		}
		mine[gid] = g.FSM().AppliedIndex()
	}
	st, err := n.getStatus(ctx, client, addr)
	recv := time.Now()
	if err == nil && st.ID != id {
		err = fmt.Errorf("%s answers as %q", addr, st.ID)
	}
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	if n.peers.views == nil {
		n.peers.views = map[string]*peerView{}
	}
	v := n.peers.views[id]
	if v == nil {
		v = &peerView{}
		n.peers.views[id] = v
	}
	if err != nil {
		v.failed = true
		return
	}
	// The member read its clock somewhere between sent and recv: assume
	// the middle. The error is at most half the round trip.
	shift, _ := wallShift()
	mid := sent.Add(shift + recv.Sub(sent)/2)
	*v = peerView{status: st, lastOK: recv, offsetMs: mid.UnixMilli() - st.NowMs, rttMs: recv.Sub(sent).Milliseconds(), mine: mine}
	n.clock.observe(id, v.offsetMs)
	n.leaders.observe(id, st.Leads, recv)
}

// ErrLastVoter refuses to remove the cluster's only voter: raft cannot
// run without one, and no retry would help.
var ErrLastVoter = refusal.New(409, "last_voter", "the only voter cannot be removed")

// removeCheck decides whether member id may be removed from servers.
func removeCheck(servers []raft.Server, id string) error {
	found, voters := false, 0
	for _, s := range servers {
		found = found || string(s.ID) == id
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	if !found {
		return fmt.Errorf("%w: %q is not a member", ErrNodeNotFound, id)
	}
	for _, s := range servers {
		if string(s.ID) == id && s.Suffrage == raft.Voter && voters == 1 {
			return fmt.Errorf("%w: %q is the cluster's only voter; add another node first, or stop this one", ErrLastVoter, id)
		}
	}
	return nil
}

// ErrNodeIDInUse refuses a join under the id of a member that is still
// running at another address.
var ErrNodeIDInUse = refusal.New(409, "node_id_in_use", "node id in use")

// joinIDCheck refuses to let info take over the id of a member recorded at
// another raft address while that member still answers, by its latest
// probe (live), from a raft address other than info's. A member that does
// not answer may be re-addressed this way (moved to another host), and so
// may one whose answer already names info's raft address (the same node,
// restarted on a new address).
func joinIDCheck(servers []raft.Server, info command.NodeInfo, live func(id string) (raftAddr string, ok bool)) error {
	for _, s := range servers {
		if string(s.ID) != info.ID || string(s.Address) == info.RaftAddr {
			continue
		}
		if addr, ok := live(info.ID); ok && addr != info.RaftAddr {
			return fmt.Errorf("%w: %q is a member at raft address %s and still runs there; start the new node with another --id, or remove that member first (mqd cluster remove)",
				ErrNodeIDInUse, info.ID, s.Address)
		}
	}
	return nil
}

// liveRaftAddr is the raft address member id reports about itself, if it
// answers (this node: its own). Its latest probe counts if it answered
// within probeStale; otherwise (not probed yet, or a probe lost under
// load) it is asked now. A member that cannot be asked (its HTTP address
// not recorded yet while a cluster forms), or does not answer, counts as
// live at an unknown address unless raft's heartbeats fail to reach it (a
// member that died, or moved to another address).
func (n *Node) liveRaftAddr(ctx context.Context, id string) (string, bool) {
	if id == n.cfg.ID {
		return n.Info().RaftAddr, true
	}
	addr := n.FSM.Nodes()[id].HTTPAddr
	if addr == "" {
		return "", !n.def.PeerDown(id)
	}
	n.peers.mu.Lock()
	if v := n.peers.views[id]; v != nil && v.answered(time.Now()) {
		ra := v.status.RaftAddr
		n.peers.mu.Unlock()
		return ra, true
	}
	n.peers.mu.Unlock()
	c := n.peerClient(probeTimeout)
	defer c.CloseIdleConnections()
	st, err := n.getStatus(ctx, c, addr)
	switch {
	case err != nil:
		// No answer over HTTP, which a loaded member may miss too: raft's
		// heartbeats decide, as for a member whose address is not
		// recorded (a dead process fails them within a heartbeat).
		return "", !n.def.PeerDown(id)
	case st.ID != id:
		return "", false // another node answers there
	}
	return st.RaftAddr, true
}

// probeClock measures the clock offset to the member at addr, if it is one
// (members holds the members' ids).
func (n *Node) probeClock(ctx context.Context, client *http.Client, addr string, members map[string]bool) {
	sent := time.Now()
	var mine map[string]uint64
	for gid, g := range n.DataGroups() {
		if mine == nil {
			mine = map[string]uint64{}
		}
		mine[gid] = g.FSM().AppliedIndex()
	}
	st, err := n.getStatus(ctx, client, addr)
	recv := time.Now()
	if err != nil || !members[st.ID] || st.ID == n.cfg.ID {
		return
	}
	shift, _ := wallShift()
	n.clock.observe(st.ID, sent.Add(shift+recv.Sub(sent)/2).UnixMilli()-st.NowMs)
}

// Peer is how this node sees member id (not itself).
func (n *Node) Peer(id string) PeerState {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	v := n.peers.views[id]
	if v == nil || v.lastOK.IsZero() {
		ps := PeerState{LastContactMs: -1, State: "unknown", Probed: v != nil}
		if ps.Probed {
			ps.State = "unreachable"
		}
		return ps
	}
	now := time.Now()
	ps := PeerState{State: v.status.State, LastContactMs: now.Sub(v.lastOK).Milliseconds(), AppliedIndex: v.status.AppliedIndex,
		CommitIndex: v.status.CommitIndex, ClockOffsetMs: v.offsetMs, Reachable: v.answered(now), Probed: true,
		StateFormatMax: v.status.StateFormatMax}
	if !ps.Reachable {
		ps.State = "unreachable"
	}
	return ps
}

// LastContactMs is, on a follower of the default group, the milliseconds
// since it last heard from the leader, -1 if it never did; 0 on the leader.
func (n *Node) LastContactMs() int64 { return n.def.LastContactMs() }

// StateName is this node's raft state in the default group: leader,
// follower, candidate or shutdown.
func (n *Node) StateName() string { return n.def.StateName() }

// RemoveNode takes member id out of the cluster (on the leader).
func (n *Node) RemoveNode(ctx context.Context, id string) error {
	if !n.IsLeader() {
		return replica.ErrNotLeader
	}
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	if err := removeCheck(servers, id); err != nil {
		return err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if err := n.def.RemoveServer(id, timeout); err != nil {
		if errors.Is(err, raft.ErrNotLeader) { // not accepted: nothing changed
			return fmt.Errorf("%w: %w", replica.ErrNotLeader, err)
		}
		return fmt.Errorf("%w: remove %s: %w", replica.ErrNoQuorum, id, err)
	}
	n.logger.Info("removed node from the cluster", "id", id)
	// Its replicas of data groups go to other nodes (moves.go).
	if moves, err := n.replaceMember(ctx, id, true); err != nil || len(moves) > 0 {
		n.logger.Info("replaced the removed node's replicas", "id", id, "moves", moves, "err", err)
	}
	return nil
}
