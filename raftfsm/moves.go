package raftfsm

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/internal/refusal"
	"github.com/mqd/mqd/replica"
)

// Moves (SPEC section 12: rebalance, drain, the removal of a node). The
// metadata leader only rewrites a data group's members in the directory
// (OpSetMembers); the group's own leader then moves its raft configuration
// there, one step per second (converge): it adds each new member as a
// non-voter (it installs a snapshot and catches up), promotes it to voter
// once its applied index is within catchUpSlack of the leader's, and only
// then removes the members the directory no longer names (itself last,
// after handing leadership to a member that stays). Nothing is copied
// outside raft, and at every step the group keeps a majority of voters
// holding every committed entry.

// catchUpSlack is how far behind the leader's applied index a new member
// may be when it is promoted to voter.
const catchUpSlack = 64

// ErrNoMoveTarget: a drain or a removal needs a node outside the group to
// hold the replica, and there is none.
var ErrNoMoveTarget = refusal.New(409, "no_move_target",
	"no node can take the replica: every other node already holds one of the group (add a node first)")

// Move is one replica moved between nodes, or a change of a group's
// preferred leader (From or To empty).
type Move struct {
	Group string `json:"group"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	// Leader: the group's preferred leader after the move.
	Leader string `json:"leader"`
}

// converge moves g's raft configuration one step towards the directory's
// members, on g's leader; it answers whether a step remains.
func (n *Node) converge(ctx context.Context, g *replica.Group) bool {
	target := n.FSM.Directory().Groups[g.ID()]
	servers, err := g.Servers()
	if len(target) == 0 || err != nil {
		return false
	}
	have := map[string]raft.ServerSuffrage{}
	for _, s := range servers {
		have[string(s.ID)] = s.Suffrage
	}
	timeout := 5 * time.Second
	for _, m := range target {
		if _, ok := have[m]; ok {
			continue
		}
		info, ok := n.FSM.Node(m)
		if !ok {
			return true
		}
		err := g.Raft().AddNonvoter(raft.ServerID(m), raft.ServerAddress(info.RaftAddr), 0, timeout).Error()
		n.logger.Info("data group: add a replica", "group", g.ID(), "node", m, "err", err)
		return true
	}
	for _, m := range target {
		if have[m] != raft.Nonvoter {
			continue
		}
		if !n.caughtUp(m, g) {
			return true
		}
		info, _ := n.FSM.Node(m)
		err := g.AddVoter(m, info.RaftAddr, timeout)
		n.logger.Info("data group: promote the new replica to voter", "group", g.ID(), "node", m, "err", err)
		return true
	}
	for _, s := range servers {
		id := string(s.ID)
		if slices.Contains(target, id) {
			continue
		}
		if id == n.cfg.ID {
			// Leave last, by handing leadership to a member that stays.
			for _, m := range target {
				if have[m] == raft.Voter && n.peerFit(m) {
					info, _ := n.FSM.Node(m)
					err := g.Raft().LeadershipTransferToServer(raft.ServerID(m), raft.ServerAddress(info.RaftAddr)).Error()
					n.logger.Info("data group: hand leadership to a staying replica", "group", g.ID(), "to", m, "err", err)
					break
				}
			}
			return true
		}
		err := g.RemoveServer(id, timeout)
		n.logger.Info("data group: remove a replica", "group", g.ID(), "node", id, "err", err)
		return true
	}
	return false
}

// caughtUp reports whether member m's latest probe answer shows its
// replica of g applied within catchUpSlack of what this node had applied
// when it sent the probe. (Compared with this node's applied index now, a
// replica under steady load would never look caught up: the answer is up
// to a probe interval old.)
func (n *Node) caughtUp(m string, g *replica.Group) bool {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	v := n.peers.views[m]
	if v == nil || v.failed || time.Since(v.lastOK) > probeStale {
		return false
	}
	at, ok := v.status.Groups[g.ID()]
	mine, known := v.mine[g.ID()]
	return ok && known && at+catchUpSlack >= mine
}

// leaveDataGroup closes this node's replica of g, which the directory no
// longer names it a member of, and deletes its files, once its data is
// not needed: the group's configuration as this replica knows it no longer
// holds it; or no leader has reached it for leaveQuiet and every member
// that stays reports having applied at least what this replica applied
// (a removed replica is not told of its removal: raft stops replicating
// to it first).
func (n *Node) leaveDataGroup(g *replica.Group) {
	if g.IsLeader() {
		return // converge hands leadership off first
	}
	inConfig := false
	if servers, err := g.Servers(); err == nil {
		inConfig = slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == n.cfg.ID })
	}
	if inConfig {
		quiet := g.LastContactMs()
		if quiet >= 0 && quiet < leaveQuiet.Milliseconds() {
			return
		}
		mine := g.FSM().AppliedIndex()
		for _, m := range n.FSM.Directory().Groups[g.ID()] {
			if !n.appliedAtLeast(m, g.ID(), mine) {
				return
			}
		}
	}
	n.data.mu.Lock()
	if n.data.open[g.ID()] != g {
		n.data.mu.Unlock()
		return
	}
	delete(n.data.open, g.ID())
	n.data.mu.Unlock()
	n.disk.untrack(g.ID())
	err := g.Shutdown()
	if rerr := os.RemoveAll(g.Dir()); err == nil {
		err = rerr
	}
	n.logger.Info("data group: replica moved off this node; files deleted", "group", g.ID(), "err", err)
}

// leaveQuiet is how long a replica the directory no longer names, still in
// its own view of the configuration, waits without a leader's contact.
const leaveQuiet = 10 * time.Second

// appliedAtLeast reports whether member m's latest probe answer shows its
// replica of group id applied at least idx.
func (n *Node) appliedAtLeast(m, id string, idx uint64) bool {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	v := n.peers.views[m]
	if v == nil || v.failed || time.Since(v.lastOK) > probeStale {
		return false
	}
	at, ok := v.status.Groups[id]
	return ok && at >= idx
}

// Drain moves every replica off node id (on the metadata leader): each
// data group that has one gets, in its place, the voter holding the fewest
// replicas among those outside the group.
func (n *Node) Drain(ctx context.Context, id string) ([]Move, error) {
	if !n.IsLeader() {
		return nil, replica.ErrNotLeader
	}
	return n.replaceMember(ctx, id, false)
}

// replaceMember gives every data group holding a replica on node id
// another node instead; gone: id is no longer a voter of the cluster.
func (n *Node) replaceMember(ctx context.Context, id string, gone bool) ([]Move, error) {
	dir := n.FSM.Directory()
	voters, err := n.voterIDs()
	if err != nil {
		return nil, err
	}
	if !gone && !slices.Contains(voters, id) {
		return nil, fmt.Errorf("%w: %s", ErrNodeNotFound, id)
	}
	load := memberLoad(dir.Groups, voters)
	var moves []Move
	for _, gid := range sortedKeys(dir.Groups) {
		ms := dir.Groups[gid]
		at := slices.Index(ms, id)
		if at < 0 {
			continue
		}
		to := ""
		for _, v := range voters {
			if v == id || slices.Contains(ms, v) {
				continue
			}
			if to == "" || load[v] < load[to] || load[v] == load[to] && v < to {
				to = v
			}
		}
		next := slices.Clone(ms)
		switch {
		case to != "":
			next[at] = to
		case gone && len(ms) > 1:
			// No node to take it: the group goes on with one replica
			// fewer rather than keep a dead member.
			next = slices.Delete(next, at, at+1)
		default:
			return moves, fmt.Errorf("%w: group %s on %v", ErrNoMoveTarget, gid, ms)
		}
		if err := n.setMembers(ctx, gid, next); err != nil {
			return moves, err
		}
		if to != "" {
			load[to]++
		}
		load[id]--
		moves = append(moves, Move{Group: gid, From: id, To: to, Leader: next[0]})
	}
	return moves, nil
}

// Rebalance evens out replicas and preferred leaders over the current
// voters (on the metadata leader): first a group with fewer members than it
// should have (Directory.WantOf; growGroups does the same every second with
// the voters that answer) gets the least loaded voters it lacks, as many as
// there are; then, while one voter holds two replicas
// more than another, a replica moves from the most to the least loaded (a
// group that has the one and not the other); then, while one voter is the
// preferred leader of two groups more than another, a group whose members
// include the other makes it its first.
func (n *Node) Rebalance(ctx context.Context) ([]Move, error) {
	if !n.IsLeader() {
		return nil, replica.ErrNotLeader
	}
	dir := n.FSM.Directory()
	voters, err := n.voterIDs()
	if err != nil {
		return nil, err
	}
	groups := map[string][]string{}
	for id, ms := range dir.Groups {
		groups[id] = slices.Clone(ms)
	}
	moves := planGrowth(groups, voters, dir.Want)
	moves = append(moves, planRebalance(groups, voters)...)
	for _, m := range moves {
		if err := n.setMembers(ctx, m.Group, groups[m.Group]); err != nil {
			return nil, err
		}
	}
	return moves, nil
}

// growGroups, on the metadata leader every second, adds voters to each
// data group with fewer members than it should have (Directory.WantOf: a
// group placed while the cluster had fewer voters than its topics'
// replicas, one a restore left smaller, one a removed node left a replica
// short) while voters it lacks answer the probes: a topic asked for three
// replicas on a one-node cluster gets them as two nodes join, as every
// voter of the default group holds every topic. Each addition is a move
// (the group's leader adds the replica through raft: moves above).
func (n *Node) growGroups(ctx context.Context) {
	dir := n.FSM.Directory()
	if len(dir.Want) == 0 {
		return
	}
	voters, err := n.voterIDs()
	if err != nil {
		return
	}
	probes := n.formatProbes(time.Now())
	live := slices.DeleteFunc(voters, func(v string) bool { return v != n.cfg.ID && !probes[v].fresh })
	groups := map[string][]string{}
	for id, ms := range dir.Groups {
		groups[id] = slices.Clone(ms)
	}
	for _, m := range planGrowth(groups, live, dir.Want) {
		if err := n.setMembers(ctx, m.Group, groups[m.Group]); err != nil {
			n.logger.Warn("data group: grow", "group", m.Group, "members", groups[m.Group], "err", err)
			return
		}
		n.logger.Info("data group: grow to the replicas it was placed for", "group", m.Group, "node", m.To,
			"members", groups[m.Group], "want", dir.Want[m.Group])
	}
}

// planGrowth adds to each group with fewer members than want names (and
// than there are voters) the least loaded voters it lacks (ties: the
// lowest id), in place, and answers the additions (moves without From).
func planGrowth(groups map[string][]string, voters []string, want map[string]int) []Move {
	var moves []Move
	for _, gid := range sortedKeys(groups) {
		for len(groups[gid]) < min(want[gid], len(voters)) {
			load := memberLoad(groups, voters)
			to := ""
			for _, v := range voters {
				if !slices.Contains(groups[gid], v) && (to == "" || load[v] < load[to]) {
					to = v
				}
			}
			if to == "" {
				break
			}
			groups[gid] = append(groups[gid], to)
			moves = append(moves, Move{Group: gid, To: to, Leader: groups[gid][0]})
		}
	}
	return moves
}

// planRebalance changes groups in place as Rebalance describes and answers
// the moves.
func planRebalance(groups map[string][]string, voters []string) []Move {
	var moves []Move
	ids := sortedKeys(groups)
	for range 1000 { // each step narrows the spread: bounded well below this
		load := memberLoad(groups, voters)
		hi, lo := extremes(load, voters)
		if load[hi]-load[lo] < 2 {
			break
		}
		moved := false
		for _, gid := range ids {
			ms := groups[gid]
			if at := slices.Index(ms, hi); at >= 0 && !slices.Contains(ms, lo) {
				ms[at] = lo
				moves = append(moves, Move{Group: gid, From: hi, To: lo, Leader: ms[0]})
				moved = true
				break
			}
		}
		if !moved {
			break
		}
	}
	for range 1000 {
		lead := map[string]int{}
		for _, v := range voters {
			lead[v] = 0
		}
		for _, gid := range ids {
			lead[groups[gid][0]]++
		}
		hi, lo := extremes(lead, voters)
		if lead[hi]-lead[lo] < 2 {
			break
		}
		moved := false
		for _, gid := range ids {
			ms := groups[gid]
			if at := slices.Index(ms, lo); ms[0] == hi && at > 0 {
				ms[0], ms[at] = ms[at], ms[0]
				moves = append(moves, Move{Group: gid, Leader: lo})
				moved = true
				break
			}
		}
		if !moved {
			break
		}
	}
	return moves
}

// extremes are the voters with the highest and the lowest count (ties: the
// lowest id).
func extremes(count map[string]int, voters []string) (hi, lo string) {
	for _, v := range voters {
		if hi == "" || count[v] > count[hi] {
			hi = v
		}
		if lo == "" || count[v] < count[lo] {
			lo = v
		}
	}
	return hi, lo
}

// memberLoad counts each voter's replicas.
func memberLoad(groups map[string][]string, voters []string) map[string]int {
	load := map[string]int{}
	for _, v := range voters {
		load[v] = 0
	}
	for _, ms := range groups {
		for _, m := range ms {
			load[m]++
		}
	}
	return load
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// voterIDs are the metadata group's voters, sorted.
func (n *Node) voterIDs() ([]string, error) {
	servers, err := n.Servers()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID))
		}
	}
	slices.Sort(out)
	return out, nil
}

func (n *Node) setMembers(ctx context.Context, id string, members []string) error {
	_, err := n.Apply(ctx, &command.Command{Op: command.OpSetMembers, Now: Now().UnixMilli(), Group: id, Members: members})
	if err != nil {
		return fmt.Errorf("set the members of data group %s: %w", id, err)
	}
	return nil
}
