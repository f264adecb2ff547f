package fsm

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// What a restart needs to start raft at the state's applied index rather
// than at the latest snapshot (replica/startsnap.go): the raft
// configuration in force there. Raft hands every committed configuration
// entry to ApplyBatch; the latest one is kept in meta, in the batch's own
// transaction, so it is always the one at the stored applied index.

// putRaftConf records configuration entry l as the latest applied.
func putRaftConf(tx *bolt.Tx, l *raft.Log) error {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(l.Data)), l.Index)
	if err := tx.Bucket(bktMeta).Put(keyRaftConf, append(v, l.Data...)); err != nil {
		return fmt.Errorf("raft configuration at %d: %w", l.Index, err)
	}
	return nil
}

// StartPoint is the state as it was opened, for raft to start from: the
// applied index and term stored with it, and the latest raft
// configuration entry it applied (its index and encoded data). ok is false
// when the state holds no configuration entry (written by an mqd before
// it recorded them, or before the first one was applied).
func (f *FSM) StartPoint() (index, term, confIndex uint64, conf []byte, ok bool) {
	_ = f.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bktMeta)
		index, term = appliedIn(m)
		if v := m.Get(keyRaftConf); len(v) > 8 {
			confIndex = binary.BigEndian.Uint64(v[:8])
			conf, ok = append([]byte(nil), v[8:]...), true
		}
		return nil
	})
	if confIndex > index {
		ok = false // not written by ApplyBatch: do not trust it
	}
	return index, term, confIndex, conf, ok
}

// markSnapshot records that the log before this point is in a snapshot
// (taken or restored): BytesSinceSnapshot counts from here.
func (f *FSM) markSnapshot() {
	f.snapMu.Lock()
	defer f.snapMu.Unlock()
	f.snapBytes.Store(f.seenBytes.Load())
	f.snapTaken = true
}

// CountLogBeforeStart adds n bytes of raft log that raft did not hand to
// the FSM at this start (entries between the latest snapshot and the
// state's applied index, which the state already held) to
// BytesSinceSnapshot, unless a snapshot was taken or restored since open:
// then they are behind it. It reports whether it added them.
func (f *FSM) CountLogBeforeStart(n uint64) bool {
	f.snapMu.Lock()
	defer f.snapMu.Unlock()
	if f.snapTaken {
		return false
	}
	f.seenBytes.Add(n)
	return true
}
