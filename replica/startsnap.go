package replica

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Starting raft at the state's applied index.
//
// raft.NewRaft reads every log entry after its latest snapshot (looking
// for configuration changes), and once it learns the commit index hands
// them all to the FSM again, which skips those fsm.db already holds. Both
// reads grow with the log since the snapshot, up to half the state's size
// under the snapshot policy and the whole log without a snapshot: 11 s
// for a node holding 5 GiB on the test machine (docs/performance.md).
//
// fsm.db is a proven state at its applied index K (fsm/checkpoint.go) and
// records the latest configuration entry it applied (fsm/raftconf.go). So
// for the one List that NewRaft makes, the snapshot store offers a
// description of that state as the newest snapshot: index K, its term and
// configuration. raft, which does not open a snapshot at start
// (NoSnapshotRestoreOnStart, set only when fsm.db covers the latest real
// one), then takes K as applied and reads the log only after it. The
// description is never a snapshot raft can send or restore: it is listed
// only during NewRaft, and opening it opens the latest real snapshot.

// startPoint is the state's applied index offered to raft as a snapshot,
// and the real latest snapshot's index behind it.
type startPoint struct {
	meta raft.SnapshotMeta
	real uint64 // index of the latest real snapshot (0: none)
}

// stateSnapshots is the snapshot store raft runs on: the file store, plus,
// while offering is set, the state's start point as the newest snapshot.
type stateSnapshots struct {
	raft.SnapshotStore
	point    *startPoint
	offering atomic.Bool
}

// List implements raft.SnapshotStore.
func (s *stateSnapshots) List() ([]*raft.SnapshotMeta, error) {
	list, err := s.SnapshotStore.List()
	if err != nil || s.point == nil || !s.offering.Load() {
		return list, err
	}
	m := s.point.meta
	return append([]*raft.SnapshotMeta{&m}, list...), nil
}

// Open implements raft.SnapshotStore: the start point opens the latest
// real snapshot (what raft would have sent without it), if there is one.
func (s *stateSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	if s.point != nil && id == s.point.meta.ID {
		list, err := s.SnapshotStore.List()
		if err != nil {
			return nil, nil, err
		}
		if len(list) == 0 {
			return nil, nil, fmt.Errorf("snapshot %s: the state's start point, not a snapshot, and there is none", id)
		}
		id = list[0].ID
	}
	return s.SnapshotStore.Open(id)
}

// startPointFor describes the state as opened as a snapshot raft can start
// from, or returns nil (and why) when raft must start from the latest real
// snapshot as it always did: the state holds no configuration entry, is
// not past that snapshot, the log does not hold its applied entry with the
// same term (lost or diverged entries), or this replica is restricted.
func (g *Group) startPointFor(list []*raft.SnapshotMeta) (*startPoint, string) {
	index, term, confIndex, conf, ok := g.fsm.StartPoint()
	var real uint64
	if len(list) > 0 {
		real = list[0].Index
	}
	switch {
	case !ok:
		return nil, "the state records no raft configuration (written by an older mqd)"
	case index <= real:
		return nil, "the state is not past the latest snapshot"
	case g.lost.restricted():
		return nil, "this replica lost log entries"
	case len(list) > 0 && confIndex < list[0].ConfigurationIndex:
		return nil, fmt.Sprintf("the state's raft configuration (index %d) is older than the latest snapshot's (%d)",
			confIndex, list[0].ConfigurationIndex)
	}
	var l raft.Log
	if err := g.stores.Log.GetLog(index, &l); err != nil || l.Term != term {
		return nil, fmt.Sprintf("the log does not hold the state's applied entry %d of term %d (%v, term %d)", index, term, err, l.Term)
	}
	var cfg raft.Configuration
	if err := decodeConfiguration(conf, &cfg); err != nil {
		return nil, err.Error()
	}
	return &startPoint{real: real, meta: raft.SnapshotMeta{
		Version: raft.SnapshotVersionMax, ID: "mqd-state-" + strconv.FormatUint(index, 10),
		Index: index, Term: term, Configuration: cfg, ConfigurationIndex: confIndex,
	}}, ""
}

// decodeConfiguration is raft.DecodeConfiguration, which panics on bad
// data, as an error.
func decodeConfiguration(b []byte, cfg *raft.Configuration) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the state's raft configuration does not decode: %v", r)
		}
	}()
	*cfg = raft.DecodeConfiguration(b)
	return nil
}

// countLogBeforeStart adds the bytes of the log entries raft did not read
// at this start (after the latest real snapshot, up to the state's
// applied index) to the FSM's count of log since the snapshot, which the
// snapshot policy reads (snapshots.go): they are still on disk. It reads
// them once raft has caught up with its commit index (or after 30 s),
// off the start's path, and gives up when ctx ends.
func (g *Group) countLogBeforeStart(ctx context.Context, p *startPoint) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	until := time.Now().Add(30 * time.Second)
	for {
		if c := g.raft.CommitIndex(); c > 0 && g.raft.AppliedIndex() >= c || time.Now().After(until) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	var n uint64
	var l raft.Log
	for i := p.real + 1; i <= p.meta.Index; i++ {
		if ctx.Err() != nil {
			return
		}
		if err := g.stores.Log.GetLog(i, &l); err != nil {
			g.logger.Warn("counting the raft log before the state's applied index", "index", i, "err", err)
			return
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration { // what raft hands the FSM
			n += uint64(len(l.Data))
		}
	}
	if g.fsm.CountLogBeforeStart(n) {
		g.logger.Debug("counted the raft log raft did not read at start", "from", p.real+1, "to", p.meta.Index, "bytes", n)
	}
}

// offerStartPoint makes snaps offer the state's start point to NewRaft,
// when there is one, and logs which way raft starts.
func (g *Group) offerStartPoint(snaps *stateSnapshots) error {
	list, err := g.snaps.List()
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	p, why := g.startPointFor(list)
	if p == nil {
		g.logger.Info("raft reads the log from the latest snapshot", "why", why)
		return nil
	}
	snaps.point, g.start = p, p
	snaps.offering.Store(true)
	g.logger.Info("raft starts at the state's applied index: the log before it is not read again",
		"applied_index", p.meta.Index, "latest_snapshot_index", p.real, "configuration_index", p.meta.ConfigurationIndex)
	return nil
}
