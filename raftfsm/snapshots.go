package raftfsm

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/replica"
)

// snapshotLoop checks every --snapshot-interval whether to snapshot.
func (n *Node) snapshotLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due, why := n.snapshotDue()
		if !due {
			continue
		}
		reclaim := why == "reclaim"
		n.boundTrailingLogs(reclaim)
		n.FSM.ReclaimNext(reclaim)
		start := time.Now()
		err := n.Raft.Snapshot().Error()
		switch {
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
		case errors.Is(err, raft.ErrRaftShutdown):
			return
		case err != nil:
			n.logger.Warn("snapshot failed", "err", err)
		default:
			if err := replica.SyncSnapshotDirs(n.cfg.DataDir); err != nil {
				n.logger.Warn("fsync of the snapshot directories", "err", err)
			}
			n.metrics.snapshots.Inc()
			n.metrics.snapshotTime.Observe(time.Since(start).Seconds())
			if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
				n.metrics.snapshotBytes.Set(float64(metas[0].Size))
				n.metrics.snapshotWritten.Add(float64(metas[0].Size))
			}
			n.logger.Info("snapshot taken", "why", why, "took", time.Since(start).Round(time.Millisecond),
				"index", n.LastSnapshotIndex())
			if reclaim {
				n.dropOlderSnapshots() // compact.go
			}
		}
	}
}

// boundTrailingLogs sets the entries raft keeps behind the snapshot it is
// about to take: --trailing-logs, but no more than about a quarter of the
// state's size in bytes (at least replica.TrailingBytesFloor), judged by the mean
// size of the entries applied since the last snapshot. The kept entries let
// a follower that fell a little behind catch up from the log rather than a
// whole snapshot; counted in entries alone, 10240 batch-publish entries of
// 1 MiB would keep 10 GiB of log on disk.
//
// A snapshot taken to give space back to a low disk (reclaim) keeps only
// replica.TrailingEntriesFloor entries: the log behind it is space too.
func (n *Node) boundTrailingLogs(reclaim bool) {
	applied, last := n.FSM.AppliedIndex(), n.LastSnapshotIndex()
	var entries uint64
	if applied > last {
		entries = applied - last
	}
	keep := replica.TrailingKeep(n.cfg.TrailingLogs, uint64(n.FSM.Size()), n.FSM.BytesSinceSnapshot(), entries)
	if reclaim {
		keep = min(n.cfg.TrailingLogs, replica.TrailingEntriesFloor)
	}
	rc := n.Raft.ReloadableConfig()
	if rc.TrailingLogs == keep {
		return
	}
	rc.TrailingLogs = keep
	if err := n.Raft.ReloadConfig(rc); err != nil {
		n.logger.Warn("setting raft's trailing logs", "entries", keep, "err", err)
	}
}

// snapshotDue applies the snapshot policy (replica/snappolicy.go).
func (n *Node) snapshotDue() (bool, string) {
	applied, last := n.FSM.AppliedIndex(), n.LastSnapshotIndex()
	if applied <= last { // nothing new: the state's size is not even read
		return false, ""
	}
	return replica.SnapshotDue(replica.SnapshotState{
		Applied: applied, LastSnapshot: last,
		StateSize: n.FSM.Size(), SinceBytes: n.FSM.BytesSinceSnapshot(), Threshold: n.cfg.SnapshotThreshold,
		Reclaim: func() bool { return n.disk.low.Load() && n.FSM.Sparse() },
	})
}
