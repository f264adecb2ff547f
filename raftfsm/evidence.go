package raftfsm

import (
	"encoding/binary"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The lost-entries check (lostlog.go) holds the raft log to how far the
// state got before this start. After an unclean stop OpenFSM rolls fsm.db
// back to its last checkpoint (checkpoint.go), which can be older than
// what the process had applied when it died: the entries between were in
// the live tree, and a log that lost its tail would go unnoticed if the
// check saw only the checkpoint. So, before the rollback, the live tree's
// applied index and term are read once, read-only, and kept as evidence.
// A file that was torn by a power loss may read an older index (never a
// newer one than the node applied) or not read at all; either leaves the
// checkpoint's index as the evidence, as before.

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
