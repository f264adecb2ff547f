package replica

import (
	"os"
	"path/filepath"

	"github.com/mqd/mqd/internal/durable"
)

// dropOlderSnapshots removes every snapshot but the latest: after a
// reclaim snapshot the older one is a copy of the state from before the
// trims and deletes, which raft would keep until the next snapshot. The
// latest is all raft reads, at start or to send to a follower.
func (g *Group) dropOlderSnapshots() {
	metas, err := g.snaps.List()
	if err != nil || len(metas) < 2 {
		return
	}
	dir := filepath.Join(g.cfg.Dir, "snapshots", "snapshots") // raft.FileSnapshotStore's layout
	for _, m := range metas[1:] {
		if err := os.RemoveAll(filepath.Join(dir, m.ID)); err != nil {
			g.logger.Warn("removing an older snapshot to give space back", "id", m.ID, "err", err)
			continue
		}
		g.logger.Info("older snapshot removed to give space back", "id", m.ID, "size", m.Size)
	}
	if err := durable.SyncDir(dir); err != nil {
		g.logger.Warn("sync of the snapshot dir", "err", err)
	}
}
