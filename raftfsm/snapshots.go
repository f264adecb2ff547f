package raftfsm

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/hashicorp/raft"
)

// When to snapshot. A snapshot copies the whole FSM — every retained
// message — so hashicorp/raft's own trigger, a count of log entries, makes
// its cost grow with the backlog: a node holding 50 GB would copy 50 GB
// every --snapshot-threshold entries. mqd takes snapshots itself: after
// --snapshot-threshold entries as before, and, once the FSM is larger than
// snapshotRatioFloor, only when the log since the last snapshot holds at
// least 1/snapshotRatio of the FSM's size. The bytes a snapshot writes then
// stay within snapshotRatio times the bytes appended to the log, and the
// log (what a restart replays, what the disk holds besides the FSM) within
// 1/snapshotRatio of the FSM.
const (
	snapshotRatioFloor = 64 << 20
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
		start := time.Now()
		err := n.Raft.Snapshot().Error()
		switch {
		case errors.Is(err, raft.ErrNothingNewToSnapshot):
		case errors.Is(err, raft.ErrRaftShutdown):
			return
		case err != nil:
			n.logger.Warn("snapshot failed", "err", err)
		default:
			n.metrics.snapshots.Inc()
			n.metrics.snapshotTime.Observe(time.Since(start).Seconds())
			if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
				n.metrics.snapshotBytes.Set(float64(metas[0].Size))
			}
			n.logger.Info("snapshot taken", "why", why, "took", time.Since(start).Round(time.Millisecond),
				"index", n.LastSnapshotIndex())
		}
	}
}

// snapshotDue applies the policy above.
func (n *Node) snapshotDue() (bool, string) {
	applied, last := n.FSM.AppliedIndex(), n.LastSnapshotIndex()
	if applied < last || applied-last < n.cfg.SnapshotThreshold {
		return false, ""
	}
	size, since := n.FSM.Size(), n.FSM.BytesSinceSnapshot()
	if size < snapshotRatioFloor {
		return true, "entries"
	}
	return since >= uint64(size)/snapshotRatio, "log bytes"
}
