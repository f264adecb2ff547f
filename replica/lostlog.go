package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/durable"
	"github.com/prometheus/client_golang/prometheus"
)

// Lost log entries (protocol-aware recovery, Alagappan et al., FAST 2018).
//
// Raft's safety rests on every voter keeping the entries it acknowledged:
// an entry committed on a majority is on at least one member of every
// majority that can elect a leader. A node whose raft log lost its tail
// (storage dropping acknowledged writes, a damaged or restored file) would
// vote, or stand, as if it never had those entries, and a majority without
// them could elect a leader that overwrites them: acknowledged writes lost.
//
// Such a node can tell when its state machine applied more than its log and
// snapshots hold: it applied entries (committed ones: only those are
// applied) that its log no longer has. From then until its log holds the
// leader's entry at that index with the term the state applied there, it
// neither votes nor stands for election (voteGate), is not ready, and its
// leader loop (a one-node cluster) serves nothing. Restricted nodes count
// as absent in elections, so every majority that can elect a leader meets
// the nodes that still hold the entries, as long as every node that lost
// them knows it. The restriction is recorded durably (lostFile) before raft
// starts, so a restart before catching up keeps it.
//
// The state is kept. The entries it applied were committed, so it is
// correct up to its applied index; ApplyBatch skips the entries the node
// receives again at indexes up to there, which is right only if they are
// the same entries. The guard checks it: raft.Log matching says two logs
// holding the same term at the same index hold the same entries up to it,
// and the state records the term of its last applied entry, so the node
// lifts the restriction only when its log holds that term at that index;
// an entry with another term there, or raft clearing a log suffix at or
// below the applied index (a leader's log conflicting with entries this
// node applied), is refused with an error, and the node stays restricted
// for good ("diverged"): its state is not the cluster's, and only an
// operator replacing the node ends it (docs/operations.md).

// lostFile, in the data dir, records a restriction: the index and term the
// node's log must hold before it votes again.
const lostFile = "lost-entries"

// lostMark is the content of lostFile.
type lostMark struct {
	Index  uint64 `json:"index"` // the state's applied index when the loss was found
	Term   uint64 `json:"term"`  // the term of the entry the state applied there
	Reason string `json:"reason"`
	// Diverged: the leader's log differs from what this node applied; the
	// restriction never lifts by itself.
	Diverged bool `json:"diverged,omitempty"`
}

// errLostEntries is what the guarded log store answers raft when it would
// overwrite entries the state applied.
var errLostEntries = errors.New("refused: the raft log would lose or replace entries this node's state applied")

// lostGuard holds a node's restriction.
type lostGuard struct {
	dir    string
	logger *slog.Logger
	mu     sync.Mutex
	mark   *lostMark // nil: not restricted
	on     atomic.Bool
	found  prometheus.Counter // the group's mqd_raft_lost_entries_found_total
	// restores is FSM.Restores when the restriction began: a snapshot
	// restored since replaced the state with the leader's.
	restores uint64
}

func newLostGuard(dir string, found prometheus.Counter, logger *slog.Logger) (*lostGuard, error) {
	g := &lostGuard{dir: dir, logger: logger, found: found}
	b, err := os.ReadFile(filepath.Join(dir, lostFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return g, nil
	case err != nil:
		return nil, fmt.Errorf("lost-entries record: %w", err)
	}
	var m lostMark
	if err := json.Unmarshal(b, &m); err != nil || m.Index == 0 {
		// Unreadable: keep the restriction, at no index it can reach.
		m = lostMark{Index: ^uint64(0), Reason: "unreadable record of lost entries", Diverged: true}
	}
	g.mark = &m
	g.on.Store(true)
	logger.Warn("still not voting: this node lost raft log entries before its last stop and has not caught up",
		"must_hold_index", m.Index, "term", m.Term, "why", m.Reason, "diverged", m.Diverged)
	return g, nil
}

// restricted reports whether the node must not vote nor stand.
func (g *lostGuard) restricted() bool { return g.on.Load() }

// diverged reports whether the node is restricted for good.
func (g *lostGuard) diverged() bool {
	if !g.on.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mark != nil && g.mark.Diverged
}

// reason is why the node does not vote, for a person ("" if it does).
func (g *lostGuard) reason() string {
	if !g.on.Load() {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mark == nil { // lifted meanwhile
		return ""
	}
	if g.mark.Diverged {
		return "not voting nor leading for good: " + g.mark.Reason + "; replace this node (docs/operations.md, Replacing a dead node)"
	}
	return fmt.Sprintf("not voting nor leading until caught up: %s; waiting for the leader's log up to index %d", g.mark.Reason, g.mark.Index)
}

// index is the log index the node must hold (0 if not restricted).
func (g *lostGuard) index() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mark == nil {
		return 0
	}
	return g.mark.Index
}

// restrict restricts the node and records m durably. A restriction in
// place is only widened: to a higher index, or to diverged (the first
// divergence found stays). The node is restricted even when the record
// cannot be written (the error says so; at open it stops the start).
func (g *lostGuard) restrict(m lostMark, restores uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old := g.mark; old != nil && (old.Diverged || !m.Diverged && old.Index >= m.Index) {
		return nil
	}
	g.mark, g.restores = &m, restores
	g.on.Store(true)
	g.found.Inc()
	path := filepath.Join(g.dir, lostFile)
	g.logger.Error("this node lost raft log entries its state applied: it does not vote nor stand for election until its log holds the leader's entries past them",
		"why", m.Reason, "must_hold_index", m.Index, "term", m.Term, "diverged", m.Diverged, "record", path)
	b, err := json.Marshal(m)
	if err == nil {
		err = durable.WriteFileSync(path, append(b, '\n'))
	}
	if err != nil {
		return fmt.Errorf("record lost entries in %s: %w", path, err)
	}
	return nil
}

// lift ends the restriction and deletes the record durably.
func (g *lostGuard) lift(why string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mark == nil || g.mark.Diverged {
		return nil
	}
	p := filepath.Join(g.dir, lostFile)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove lost-entries record: %w", err)
	}
	if err := durable.SyncDir(g.dir); err != nil {
		return fmt.Errorf("remove lost-entries record: %w", err)
	}
	g.logger.Info("caught up past the raft log entries this node had lost: it votes and stands for election again",
		"held_index", g.mark.Index, "how", why)
	g.mark = nil
	g.on.Store(false)
	return nil
}

// checkLostAtOpen restricts the node when its state applied more than its
// log and snapshots hold. applied and term are the state's as opened.
func (g *Group) checkLostAtOpen(applied, term uint64, snaps raft.SnapshotStore) error {
	if applied == 0 {
		return nil
	}
	last, err := g.stores.Log.LastIndex()
	if err != nil {
		return fmt.Errorf("raft log store: %w", err)
	}
	var snap uint64
	if list, err := snaps.List(); err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	} else if len(list) > 0 {
		snap = list[0].Index
	}
	if applied <= max(last, snap) {
		return nil
	}
	return g.lost.restrict(lostMark{Index: applied, Term: term, Reason: fmt.Sprintf(
		"the state applied index %d but the raft log ends at %d and the latest snapshot is at %d: entries %d to %d are gone from this node's log",
		applied, last, snap, max(last, snap)+1, applied)}, g.fsm.Restores())
}

// lostEvery is how often a restricted node checks whether it caught up.
const lostEvery = 100 * time.Millisecond

// lostLoop lifts the restriction once the node holds the leader's log past
// the index it lost, until ctx ends.
func (g *Group) lostLoop(ctx context.Context) {
	t := time.NewTicker(lostEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !g.lost.restricted() {
			continue
		}
		if how := g.caughtUpPastLost(); how != "" {
			if err := g.lost.lift(how); err != nil {
				g.logger.Error("lifting the lost-entries restriction", "err", err)
			}
		}
	}
}

// caughtUpPastLost says how the node caught up past its restriction's
// index, or "" if it has not: raft applied that index (the leader
// committed it and this node holds it) and the log holds there the term
// the state applied (so the logs match up to it); or a snapshot from the
// leader replaced the state at or past it.
func (g *Group) caughtUpPastLost() string {
	g.lost.mu.Lock()
	m, restores := g.lost.mark, g.lost.restores
	g.lost.mu.Unlock()
	if m == nil || m.Diverged || g.raft.AppliedIndex() < m.Index {
		return ""
	}
	var l raft.Log
	err := g.stores.Log.GetLog(m.Index, &l)
	switch {
	case err == nil && l.Term == m.Term:
		return fmt.Sprintf("the log holds index %d at term %d, as the state applied it", m.Index, m.Term)
	case err == nil:
		g.diverged(fmt.Sprintf("the leader's entry at index %d has term %d, the state applied term %d there", m.Index, l.Term, m.Term))
	case g.fsm.Restores() > restores && g.fsm.AppliedIndex() >= m.Index:
		return fmt.Sprintf("a snapshot from the leader replaced the state, applied to %d", g.fsm.AppliedIndex())
	}
	return ""
}

// diverged restricts the node for good: the cluster's log differs from the
// one its state applied.
func (g *Group) diverged(why string) {
	idx, term := g.fsm.AppliedIndexTerm()
	if err := g.lost.restrict(lostMark{Index: idx, Term: term, Reason: why, Diverged: true}, g.fsm.Restores()); err != nil {
		g.logger.Error("recording the divergence", "err", err)
	}
}

// leadGate holds a newly elected leader back from serving while it is
// restricted (a one-node cluster elects its only voter without a vote
// from anyone): it returns false when ctx ends first.
func (g *Group) leadGate(ctx context.Context) bool {
	if !g.lost.restricted() {
		return true
	}
	// Elected while refusing every vote: the only voter. No other node
	// holds the lost entries; the state does (a backup of it restored as a
	// new cluster keeps them: docs/operations.md, Backup and restore).
	g.logger.Error("elected, but not serving: " + g.lost.reason() +
		"; this cluster's only voter has no other copy of the lost entries: restore as a new cluster (mqd restore) the fsm.db.lost-<time> copy it kept in its data dir, or, after a clean stop, a backup of its state (GET /v1/cluster/backup)")
	for g.lost.restricted() {
		if Pause(ctx, lostEvery) != nil {
			return false
		}
	}
	return true
}
