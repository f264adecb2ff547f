package fsm

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/durable"

	bolt "go.etcd.io/bbolt"
)

// The lost-entries check (replica/lostlog.go) holds the raft log to how far the
// state got before this start. After an unclean stop OpenFSM rolls fsm.db
// back to its last checkpoint (checkpoint.go), which can be older than
// what the process had applied when it died: the entries between were in
// the live tree, and a log that lost its tail would go unnoticed if the
// check saw only the checkpoint. So, before the rollback, the live tree's
// applied index and term are read once, read-only, and kept as evidence.
// A file that was torn by a power loss may read an older index (never a
// newer one than the node applied) or not read at all; either leaves the
// checkpoint's index as the evidence, as before.
//
// When that live tree is ahead of everything the log and the snapshots
// can bring the state back to (the log lost its tail), the rollback would
// throw away the only copy this node has of what it had applied: the file
// is first copied to fsm.db.lost-<UTC time> (fsynced), a bbolt file like a
// backup, which `mqd restore` takes. In a cluster the leader still holds
// those entries and the node catches up from it; a one-node cluster's
// operator restores the copy (docs/operations.md).

// liveApplied reads the applied index and term that the tree fsm.db's
// newest valid meta page points at records. ok is false when the file
// does not read cleanly (it is then rolled back or set aside anyway).
func liveApplied(path string) (index, term uint64, ok bool) {
	if _, err := preCheck(path, nil); err != nil {
		return 0, 0, false
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			index, term, ok = 0, 0, false
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, 0, false
	}
	defer closeQuietly(db)
	err = db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bktMeta)
		if m == nil {
			return nil
		}
		if v := m.Get(keyApplied); len(v) == 8 {
			index, ok = binary.BigEndian.Uint64(v), true
		}
		if v := m.Get(keyTerm); len(v) == 8 {
			term = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return index, term, ok && err == nil
}

// keepLiveEvidence reads the live tree's applied index and term into
// f.live, and copies the file aside when that index is past both the
// checkpoint's (ckpt) and what the log and snapshots back (see above).
func (f *FSM) keepLiveEvidence(ckpt, backed uint64) error {
	index, term, ok := liveApplied(f.path)
	if !ok {
		return nil
	}
	f.live = [2]uint64{index, term}
	if index <= ckpt || index <= backed {
		return nil
	}
	aside := asideName(f.path, "lost")
	if err := copyFileSync(f.path, aside); err != nil {
		return fmt.Errorf("keep a copy of fsm.db ahead of its log: %w", err)
	}
	f.logger.Error("fsm.db applied entries its raft log and snapshots no longer hold: a copy of it is kept before it is "+
		"rolled back to its checkpoint (restore it with mqd restore if no other node has those entries)",
		"applied_index", index, "log_and_snapshots_reach", backed, "checkpoint_index", ckpt, "copy", aside)
	return nil
}

// LogBacks is the highest index the raft log or a snapshot holds.
func LogBacks(log raft.LogStore, snaps raft.SnapshotStore) (uint64, error) {
	last, err := log.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("raft log store: %w", err)
	}
	list, err := snaps.List()
	if err != nil {
		return 0, fmt.Errorf("snapshot store: %w", err)
	}
	if len(list) > 0 {
		last = max(last, list[0].Index)
	}
	return last, nil
}

// copyFileSync copies src to a new file dst, fsyncs it and its directory.
func copyFileSync(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return durable.SyncDir(filepath.Dir(dst))
}

// AppliedFloor is the highest index this node's state is known to have
// applied: its applied index, or, after an unclean stop rolled fsm.db back
// to its checkpoint, what the live tree had applied before, whichever is
// higher. guardedLog refuses to replace entries up to it (f.live is set
// in OpenFSM, before raft starts, and never changes).
func (f *FSM) AppliedFloor() uint64 { return max(f.AppliedIndex(), f.live[0]) }
