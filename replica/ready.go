package replica

import "github.com/hashicorp/raft"

// What the node's readiness check (raftfsm/ready.go) asks of a group.

// AppliedIndex is the index of the last command the group's state applied.
func (g *Group) AppliedIndex() uint64 { return g.fsm.AppliedIndex() }

// LostReason is why this replica neither votes nor stands for election
// (its raft log lost entries its state applied, lostlog.go), for a person;
// "" while it votes.
func (g *Group) LostReason() string { return g.lost.reason() }

// AppliedTo reports whether the FSM, at inState, has applied every entry up
// to commit. The FSM counts only commands, so it has when raft has handed
// every entry up to commit on and none after inState is a command. A snapshot
// the FSM holds (one it took, or one installed and restored, which raft
// counts as applied only once restored) covers what it holds, though its
// last command may be older (entries before it may be gone from the log).
func (g *Group) AppliedTo(commit, inState uint64) bool {
	if inState >= commit || g.appliedTo.Load() >= commit {
		return true
	}
	applied := g.raft.AppliedIndex()
	if applied < commit {
		return false
	}
	if s := g.LastSnapshotIndex(); s > inState && s <= applied {
		inState = s
	}
	var l raft.Log
	for i := inState + 1; i <= commit; i++ {
		if err := g.stores.Log.GetLog(i, &l); err != nil || l.Type == raft.LogCommand {
			return false
		}
	}
	for { // keep the highest: a new leader's commit index may be lower
		old := g.appliedTo.Load()
		if old >= commit || g.appliedTo.CompareAndSwap(old, commit) {
			return true
		}
	}
}

// FirstLogIndex is the first index the group's raft log holds (0 when
// empty): entries before it were compacted into a snapshot.
func (g *Group) FirstLogIndex() (uint64, error) { return g.stores.Log.FirstIndex() }
