package raftfsm

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/replica"
)

// When to snapshot. A snapshot copies the whole FSM — every retained
// message — so hashicorp/raft's own trigger, a count of log entries, makes
// its cost grow with the backlog (a node holding 50 GB would copy 50 GB
// every --snapshot-threshold entries), and says nothing of their size (a
// group commit of batch publishes is one entry of up to 4 MiB, so 8192 of
// them are 32 GiB of log and no snapshot). mqd takes snapshots itself,
// when the raft log applied since the last one holds at least
// 1/snapshotRatio of the state's size (or of snapshotRatioFloor, for a
// smaller state), or, while the state is under snapshotRatioFloor, after
// --snapshot-threshold entries. So:
//   - the bytes snapshots write stay within snapshotRatio times the log
//     bytes, or snapshotRatioFloor per --snapshot-threshold entries for a
//     small state (512 bytes per entry at the default 8192);
//   - the log a restart reads back and the disk keeps stays within half
//     the state (or 2 MiB, or the threshold's entries, if larger).
//
// BenchmarkSnapshotBytes and BenchmarkRestart measure both.
const (
	snapshotRatioFloor = 4 << 20
	snapshotRatio      = 2
	// raftSnapshotOff is the threshold given to raft: never by itself.
	raftSnapshotOff = math.MaxUint64
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

// trailingBytesFloor is the least raft log, in bytes, a snapshot leaves
// behind it (see boundTrailingLogs).
const trailingBytesFloor = 64 << 20

// boundTrailingLogs sets the entries raft keeps behind the snapshot it is
// about to take: --trailing-logs, but no more than about a quarter of the
// state's size in bytes (at least trailingBytesFloor), judged by the mean
// size of the entries applied since the last snapshot. The kept entries let
// a follower that fell a little behind catch up from the log rather than a
// whole snapshot; counted in entries alone, 10240 batch-publish entries of
// 1 MiB would keep 10 GiB of log on disk.
//
// A snapshot taken to give space back to a low disk (reclaim) keeps only
// trailingEntriesFloor entries: the log behind it is space too.
func (n *Node) boundTrailingLogs(reclaim bool) {
	applied, last := n.FSM.AppliedIndex(), n.LastSnapshotIndex()
	var entries uint64
	if applied > last {
		entries = applied - last
	}
	keep := trailingKeep(n.cfg.TrailingLogs, uint64(n.FSM.Size()), n.FSM.BytesSinceSnapshot(), entries)
	if reclaim {
		keep = min(n.cfg.TrailingLogs, trailingEntriesFloor)
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

// trailingEntriesFloor is the fewest entries a snapshot leaves behind it,
// however large they are.
const trailingEntriesFloor = 16

// trailingKeep is how many entries to keep behind a snapshot: at most
// trailing, and no more than fit in a quarter of the state's size (at
// least trailingBytesFloor) at the mean size of the sinceEntries entries
// (sinceBytes) applied since the last snapshot; never fewer than
// trailingEntriesFloor (or trailing, if lower).
func trailingKeep(trailing, stateSize, sinceBytes, sinceEntries uint64) uint64 {
	if sinceEntries == 0 || sinceBytes == 0 {
		return trailing
	}
	mean := max(sinceBytes/sinceEntries, 1)
	fit := max(stateSize/4, trailingBytesFloor) / mean
	return min(trailing, max(fit, trailingEntriesFloor))
}

// snapshotDue applies the policy above.
func (n *Node) snapshotDue() (bool, string) {
	applied, last := n.FSM.AppliedIndex(), n.LastSnapshotIndex()
	if applied <= last {
		return false, ""
	}
	if n.disk.low.Load() && n.FSM.Sparse() {
		return true, "reclaim" // the snapshot compacts the state first (fsm/compact.go)
	}
	size, since := n.FSM.Size(), n.FSM.BytesSinceSnapshot()
	if since >= uint64(max(size, snapshotRatioFloor))/snapshotRatio {
		return true, "log bytes"
	}
	if size < snapshotRatioFloor && applied-last >= n.cfg.SnapshotThreshold {
		return true, "entries"
	}
	return false, ""
}
