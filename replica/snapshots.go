package replica

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
)

// snapshotLoop checks every --snapshot-interval whether to snapshot.
func (g *Group) snapshotLoop(ctx context.Context) {
	t := time.NewTicker(g.cfg.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due, why := g.snapshotDue()
		if !due {
			continue
		}
		reclaim := why == "reclaim"
		g.boundTrailingLogs(reclaim)
		g.fsm.ReclaimNext(reclaim)
		start := time.Now()
		err := g.raft.Snapshot().Error()
		switch {
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
		case errors.Is(err, raft.ErrRaftShutdown):
			return
		case err != nil:
			g.logger.Warn("snapshot failed", "err", err)
		default:
			if err := SyncSnapshotDirs(g.cfg.Dir); err != nil {
				g.logger.Warn("fsync of the snapshot directories", "err", err)
			}
			g.metrics.snapshots.Inc()
			g.metrics.snapshotTime.Observe(time.Since(start).Seconds())
			if metas, err := g.snaps.List(); err == nil && len(metas) > 0 {
				g.metrics.snapshotBytes.Set(float64(metas[0].Size))
				g.metrics.snapshotWritten.Add(float64(metas[0].Size))
			}
			g.logger.Info("snapshot taken", "why", why, "took", time.Since(start).Round(time.Millisecond),
				"index", g.LastSnapshotIndex())
			if reclaim {
				g.dropOlderSnapshots() // compact.go
			}
		}
	}
}

// boundTrailingLogs sets the entries raft keeps behind the snapshot it is
// about to take: --trailing-logs, but no more than about a quarter of the
// state's size in bytes (at least TrailingBytesFloor), judged by the mean
// size of the entries applied since the last snapshot. The kept entries let
// a follower that fell a little behind catch up from the log rather than a
// whole snapshot; counted in entries alone, 10240 batch-publish entries of
// 1 MiB would keep 10 GiB of log on disk.
//
// A snapshot taken to give space back to a low disk (reclaim) keeps only
// TrailingEntriesFloor entries: the log behind it is space too.
func (g *Group) boundTrailingLogs(reclaim bool) {
	applied, last := g.fsm.AppliedIndex(), g.LastSnapshotIndex()
	var entries uint64
	if applied > last {
		entries = applied - last
	}
	keep := TrailingKeep(g.cfg.TrailingLogs, uint64(g.fsm.Size()), g.fsm.BytesSinceSnapshot(), entries)
	if reclaim {
		keep = min(g.cfg.TrailingLogs, TrailingEntriesFloor)
	}
	rc := g.raft.ReloadableConfig()
	if rc.TrailingLogs == keep {
		return
	}
	rc.TrailingLogs = keep
	if err := g.raft.ReloadConfig(rc); err != nil {
		g.logger.Warn("setting raft's trailing logs", "entries", keep, "err", err)
	}
}

// snapshotDue applies the snapshot policy (replica/snappolicy.go).
func (g *Group) snapshotDue() (bool, string) {
	applied, last := g.fsm.AppliedIndex(), g.LastSnapshotIndex()
	if applied <= last { // nothing new: the state's size is not even read
		return false, ""
	}
	return SnapshotDue(SnapshotState{
		Applied: applied, LastSnapshot: last,
		StateSize: g.fsm.Size(), SinceBytes: g.fsm.BytesSinceSnapshot(), Threshold: g.cfg.SnapshotThreshold,
		Reclaim: func() bool { return g.cfg.Hooks.DiskLow != nil && g.cfg.Hooks.DiskLow() && g.fsm.Sparse() },
	})
}
