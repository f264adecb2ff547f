package replica

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// guardedLog is the raft log store as raft sees it: it refuses the two
// writes that would make the log disagree with entries the state machine
// already applied (ApplyBatch skips indexes at or below its applied index,
// so a different entry stored there would never be applied, silently):
//
//   - DeleteRange clearing entries after the latest snapshot and at or
//     below the applied index. Raft clears a follower's log suffix when a
//     leader's entry conflicts with it; a conflict at an applied (so
//     committed) index means the leader lacks entries this node applied.
//     Compaction after a snapshot deletes only entries the snapshot covers,
//     and after a snapshot is installed the state was replaced by it, so
//     neither is refused.
//   - StoreLogs of an entry at the state's applied index with another term
//     than the state applied there (a log that lost its tail receives the
//     indexes again; the same term at the same index means the same log up
//     to it).
//
// Either refusal restricts the node for good (lostlog.go): raft's follower
// answers the leader's AppendEntries with failure and keeps its log; the
// node does not vote, stand, or report ready.
type guardedLog struct {
	raft.LogStore
	g *Group
}

// IsMonotonic passes raft-wal's answer through (raft resets a monotonic
// store's log after installing a snapshot instead of compacting it).
func (g guardedLog) IsMonotonic() bool {
	m, ok := g.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// StoreLogs refuses an entry at the applied index with another term.
func (g guardedLog) StoreLogs(logs []*raft.Log) error {
	if len(logs) > 0 && logs[0].Index <= g.g.fsm.AppliedFloor() {
		idx, term := g.g.fsm.LostEvidence()
		for _, l := range logs {
			if l.Index == idx && l.Term != term {
				why := fmt.Sprintf("a leader sent an entry at index %d with term %d, where the state applied term %d", idx, l.Term, term)
				g.g.diverged(why)
				return fmt.Errorf("%w: %s", errLostEntries, why)
			}
		}
	}
	return g.LogStore.StoreLogs(logs)
}

// GetLog answers, while raft runs from the state's start point
// (startsnap.go), the entry at the latest real snapshot's index with that
// snapshot's term when the log no longer holds it. Raft, which takes the
// start point for its latest snapshot, looks that entry up for the term a
// follower's AppendEntries must match after it installed the real
// snapshot; the log of a replica that itself caught up from that snapshot
// starts right after it, and without the term the leader sent the
// snapshot again and again, and the follower (a new member being added)
// never caught up. The entry serves only as that "previous entry": raft
// sends the entries after it, which the log holds.
func (g guardedLog) GetLog(index uint64, l *raft.Log) error {
	err := g.LogStore.GetLog(index, l)
	if !errors.Is(err, raft.ErrLogNotFound) || g.g.start == nil || index != g.g.start.real {
		return err
	}
	list, lerr := g.g.snaps.List()
	if lerr != nil || len(list) == 0 || list[0].Index != index {
		return err
	}
	*l = raft.Log{Index: index, Term: list[0].Term, Type: raft.LogNoop}
	return nil
}

// StoreLog stores one entry through StoreLogs' check.
func (g guardedLog) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

// DeleteRange refuses to clear applied entries no snapshot covers.
func (g guardedLog) DeleteRange(lo, hi uint64) error {
	if applied := g.g.fsm.AppliedFloor(); lo <= applied {
		snap, err := g.g.latestSnapshotIndex()
		if err != nil {
			return err
		}
		if lo > snap {
			why := fmt.Sprintf("raft would clear the log from index %d to %d, though the state applied up to %d (a leader's log conflicts with entries this node applied)", lo, hi, applied)
			g.g.diverged(why)
			return fmt.Errorf("%w: %s", errLostEntries, why)
		}
	}
	return g.LogStore.DeleteRange(lo, hi)
}

// latestSnapshotIndex is the index of the newest snapshot in the store (0
// if none).
func (g *Group) latestSnapshotIndex() (uint64, error) {
	list, err := g.snaps.List()
	if err != nil {
		return 0, fmt.Errorf("snapshot store: %w", err)
	}
	if len(list) == 0 {
		return 0, nil
	}
	return list[0].Index, nil
}
