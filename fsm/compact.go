package fsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mqd/mqd/internal/durable"
	bolt "go.etcd.io/bbolt"
)

// Giving back the space of trimmed and deleted messages. bbolt never
// shrinks its file: pages freed by a trim or a topic deletion are reused
// by later writes, but the file keeps its size, and a snapshot (a copy of
// the whole file, free pages included) keeps it too. So once a state is
// sparse — at least compactFreeFraction of fsm.db free, and at least
// compactMinFree bytes — the node rewrites fsm.db as a compacted copy
// (bbolt's Compact: every bucket and key walked into a new file, pages
// filled whole), at two safe points where no write transaction is open:
//   - at open (raftfsm/node.go calls CompactAtStart right after OpenFSM), before raft
//     applies anything;
//   - in FSM.Snapshot (fsm.go, its first line), which raft calls on its
//     FSM goroutine between two applies; applies wait for the copy, which
//     takes time in proportion to the live data (docs/performance.md), so
//     there only while the live data is at most compactStallMax, or when
//     the disk is under its floor (writes that add data are refused then,
//     and the compaction is what brings them back). The snapshot is then
//     taken from the compacted file, so it is small too, and a follower
//     restoring it gets a compacted fsm.db.
//
// The snapshot loop takes a snapshot for the purpose ("reclaim") when the
// disk is under its floor and the state is sparse; that snapshot keeps
// only a few log entries behind it, and once it is taken the older
// snapshots (raft keeps two; the older is the large one) are removed.
//
// Durability: the checkpoint of the old file is durably dropped (its
// pinned read transaction would also hold bbolt's Close for ever), the
// copy is written to fsm.db.compact, fsynced, closed, renamed over fsm.db
// and the directory fsynced, and a checkpoint of the new file is taken,
// the same way Restore installs a snapshot. A crash between the drop and
// the new checkpoint finds no checkpoint: the file is set aside and the
// state rebuilt from the latest snapshot and the log (checkpoint.go). A crash before the rename leaves the old fsm.db
// (and a stale fsm.db.compact, removed at the next compaction or open); a
// crash after it leaves a complete, fsynced file at the same applied
// index as the one it replaced.
const (
	compactFreeFraction = 0.5
	compactMinFree      = 8 << 20
	compactSuffix       = ".compact"
	// compactTxBytes bounds one write transaction of the copy.
	compactTxBytes = 64 << 20
	// compactStallMax is the most live data compacted while applies wait,
	// unless the disk is low: 2 to 6 s here (BenchmarkSnapshotCompact,
	// docs/performance.md).
	compactStallMax = 256 << 20
)

// spaceStats reports fsm.db's size in bytes (what a snapshot of it
// copies) and the bytes of free pages in it.
//
// A closed state (a data group's replica that left this node while the
// disk guard was adding up its groups) reports 0, 0: nothing to snapshot.
// bbolt's Info panics on a closed database, so the page size is read
// inside the transaction, which fails on one.
func (f *FSM) spaceStats() (size, free int64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var pageSize int64
	if err := f.db.View(func(tx *bolt.Tx) error {
		size, pageSize = tx.Size(), int64(tx.DB().Info().PageSize)
		return nil
	}); err != nil {
		return 0, 0
	}
	st := f.db.Stats()
	free = int64(st.FreePageN+st.PendingPageN) * pageSize
	return size, min(free, size)
}

// sparse reports whether fsm.db is worth compacting (see above).
func sparse(size, free int64) bool {
	return free >= compactMinFree && float64(free) >= compactFreeFraction*float64(size)
}

// Sparse reports whether the state would be compacted at the next
// snapshot.
func (f *FSM) Sparse() bool { return sparse(f.spaceStats()) }

// NextSnapshotSize is about the bytes the next snapshot writes: fsm.db's
// size, or, when the state is sparse, its live pages (the snapshot is
// taken from a compacted copy). The compaction itself needs no more: it
// writes the live pages to a new file and the old file's space is
// returned before the snapshot is written.
// A sparse state with more live data than compactStallMax is counted
// whole: it is compacted at a snapshot only once the disk is low.
func (f *FSM) NextSnapshotSize() uint64 {
	size, free := f.spaceStats()
	if sparse(size, free) && size-free <= compactStallMax {
		return uint64(size - free)
	}
	return uint64(size)
}

// compactIfSparse compacts fsm.db when it is sparse, and its live data at
// most compactStallMax unless force. It must be called where no write
// transaction can start (at open, or on raft's FSM goroutine). A failure
// (no room for the copy) leaves fsm.db as it was.
func (f *FSM) compactIfSparse(force bool) {
	size, free := f.spaceStats()
	if !sparse(size, free) || (size-free > compactStallMax && !force) {
		return
	}
	start := time.Now()
	if err := f.compact(); err != nil {
		f.logger.Warn("compacting the state file failed; it keeps its size", "size", size, "free_in_file", free, "err", err)
		return
	}
	after, _ := f.spaceStats()
	f.logger.Info("state file compacted: space of trimmed and deleted data given back",
		"before", size, "after", after, "took", time.Since(start).Round(time.Millisecond))
}

// compact replaces fsm.db with a compacted copy (see above).
func (f *FSM) compact() error {
	tmp := f.path + compactSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := writeCompactCopy(f.db, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The checkpoint is of the old file, and its read transaction would
	// hold Close for ever: durably none until the new file's (as Restore).
	if err := f.dropCheckpoint(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	// The compacted copy takes the name first: if that fails, the old
	// file is still in place and open, and goes on as it was.
	if err := os.Rename(tmp, f.path); err != nil {
		_ = os.Remove(tmp)
		if cerr := f.takeCheckpoint(false); cerr != nil {
			return fmt.Errorf("compact: %w; checkpoint: %w", err, cerr)
		}
		return fmt.Errorf("compact: %w", err)
	}
	// The old file's inode outlives its name while it is open: closed now,
	// or by a backup still copying it (heldtx.go).
	if err := f.held.retire(f.db); err != nil {
		f.logger.Warn("closing the state file replaced by its compacted copy", "err", err)
	}
	// Either file holds the same state at the same applied index: a
	// failed directory sync leaves which one a power loss keeps open, and
	// the node goes on with the new one.
	serr := durable.SyncDir(filepath.Dir(f.path))
	db, err := openDB(f.path)
	if err != nil {
		// No state machine to apply to: stop as for any write it cannot
		// take (the log holds every committed entry).
		stopOnStorageError(f.logger, f.applied.Load(), fmt.Errorf("compact: reopen: %w", err))
		return err
	}
	f.db = db
	if err := f.takeCheckpoint(false); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("compact: sync dir (the compacted file is in use): %w", serr)
	}
	return nil
}

// writeCompactCopy writes src's buckets and keys into a new bbolt file at
// path and fsyncs it.
func writeCompactCopy(src *bolt.DB, path string) error {
	opts := *boltOpts
	opts.InitialMmapSize = 0
	dst, err := bolt.Open(path, 0o600, &opts)
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	if err := bolt.Compact(dst, src, compactTxBytes); err != nil {
		dst.Close()
		return fmt.Errorf("compact: %w", err)
	}
	// The last commit writes the free list, so that opening the copy
	// reads it rather than walks the file.
	dst.NoFreelistSync = false
	if err := dst.Update(func(*bolt.Tx) error { return nil }); err != nil {
		dst.Close()
		return fmt.Errorf("compact: %w", err)
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return fmt.Errorf("compact sync: %w", err)
	}
	if err := dst.Close(); err != nil {
		return fmt.Errorf("compact close: %w", err)
	}
	return nil
}

// removeCompactLeftover removes a copy a crash left behind.
func removeCompactLeftover(path string) {
	_ = os.Remove(path + compactSuffix)
}

// CompactAtStart removes what an interrupted compaction left and compacts
// the file when it is sparse, or when force (a low disk) and it has space
// to give back.
func (f *FSM) CompactAtStart(force bool) {
	removeCompactLeftover(f.path)
	f.compactIfSparse(force)
}

// ReclaimNext says whether the next snapshot is taken to give space back
// to a low disk (it then compacts a sparse state whatever its size).
func (f *FSM) ReclaimNext(on bool) { f.reclaim.Store(on) }
