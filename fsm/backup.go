package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Backup is a consistent copy of the state machine: the whole bbolt file
// as one read transaction saw it, at applied raft index Index.
type Backup struct {
	File  *os.File // positioned at the start; unlinked: closing it frees the space
	Size  int64
	Index uint64
	Term  uint64
}

// ErrNotBackup: a restore was given a file that is not an mqd state
// backup.
var ErrNotBackup = errors.New("not an mqd backup")

// Backup copies the state machine, as one bbolt read transaction sees it,
// into an unlinked temporary file in dir, and returns it for the
// caller to stream and close. The copy, not the transaction, is what a slow
// client reads: a read transaction held open keeps bbolt from growing its
// memory map, which would stall applies. The file needs the state's size
// in free space: room is asked first, with the copy's size, and its error
// is returned.
func (f *FSM) Backup(dir string, room func(size int64) error) (*Backup, error) {
	f.mu.RLock()
	tx, err := f.db.Begin(false)
	if err != nil {
		f.mu.RUnlock()
		return nil, fmt.Errorf("backup: %w", err)
	}
	release := f.held.hold(f.db) // a Restore or compaction does not wait for the copy (heldtx.go)
	f.mu.RUnlock()
	defer func() { _ = tx.Rollback(); release() }()
	b := &Backup{Size: tx.Size()}
	b.Index, b.Term = metaApplied(tx)
	if err := room(b.Size); err != nil {
		return nil, err
	}
	b.File, err = Spool(dir, func(w io.Writer) error {
		_, err := tx.WriteTo(w)
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Spool writes a backup's copy with write into an unlinked temporary file
// in dir (a crash leaves nothing behind) and answers it positioned at its
// start, for the caller to read and close; on an error nothing is left.
func Spool(dir string, write func(io.Writer) error) (*os.File, error) {
	tmp, err := os.CreateTemp(dir, "backup-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := write(tmp); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup copy: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup: %w", err)
	}
	return tmp, nil
}

func metaApplied(tx *bolt.Tx) (index, term uint64) {
	m := tx.Bucket(bktMeta)
	if m == nil {
		return 0, 0
	}
	if v := m.Get(keyApplied); len(v) == 8 {
		index = binary.BigEndian.Uint64(v)
	}
	if v := m.Get(keyTerm); len(v) == 8 {
		term = binary.BigEndian.Uint64(v)
	}
	return index, term
}

// PrepareState checks that path is an mqd state file with an applied
// index, drops the old cluster's node addresses and raft configuration, and sets the applied term
// to term, the restored snapshot's. It returns the applied index.
func PrepareState(path string, term uint64) (uint64, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoGrowSync: true})
	if err != nil {
		return 0, fmt.Errorf("restore: %w: %w", ErrNotBackup, err)
	}
	defer db.Close()
	var index uint64
	err = db.Update(func(tx *bolt.Tx) error {
		var was uint64
		index, was = metaApplied(tx)
		if index == 0 || was == 0 || tx.Bucket(bktNodes) == nil {
			return fmt.Errorf("%w: no applied index or node bucket", ErrNotBackup)
		}
		if err := tx.DeleteBucket(bktNodes); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bktNodes); err != nil {
			return err
		}
		// The old cluster's raft configuration is not the new one's.
		if err := tx.Bucket(bktMeta).Delete(keyRaftConf); err != nil {
			return err
		}
		return tx.Bucket(bktMeta).Put(keyTerm, binary.BigEndian.AppendUint64(nil, term))
	})
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	if err := db.Sync(); err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	return index, nil
}

// StateTopics lists the topics the state file at path holds (a restore
// places a data group's topics in it by what its own state holds).
func StateTopics(path string) ([]string, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("restore: %w: %w", ErrNotBackup, err)
	}
	defer db.Close()
	var out []string
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bktMeta) == nil {
			return fmt.Errorf("%w: no meta bucket", ErrNotBackup)
		}
		mlog.EachTopicAfter(tx, "", func(name string) bool {
			out = append(out, name)
			return true
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return out, nil
}

// RestoredGroup is a data group as RestoreDirectory records it: the
// topics its own state holds, and how many members it had.
type RestoredGroup struct {
	Topics []string
	Want   int
}

// RestoreDirectory rewrites the directory of the metadata state at path
// (after PrepareState) for a restored one-node cluster: each data group of
// groups gets the one member id, as a group that never moved, and, when it
// had more, the count to grow back to (Directory.Want, which a rebalance
// fills once nodes have joined); a group the directory records but groups
// lacks is dropped with its placements; and every topic of groups is
// placed in its group (restoredPlacements), so that a topic created in a
// data group after the metadata's copy was taken is found all the same.
// The file must be a metadata state: one with a directory.
func RestoreDirectory(path, id string, groups map[string]RestoredGroup) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoGrowSync: true})
	if err != nil {
		return fmt.Errorf("restore: %w: %w", ErrNotBackup, err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		old := tx.Bucket(bktDirectory)
		if old == nil {
			return fmt.Errorf("%w: the metadata state has no directory of data groups", ErrNotBackup)
		}
		keep, err := restoredPlacements(old, groups)
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(bktDirectory); err != nil {
			return err
		}
		b, err := tx.CreateBucket(bktDirectory)
		if err != nil {
			return err
		}
		for g, rg := range groups {
			if err := b.Put(append([]byte{'g'}, g...), encodeMembers(0, []string{id})); err != nil {
				return err
			}
			if rg.Want > 1 {
				if err := b.Put(append([]byte{'w'}, g...), binary.BigEndian.AppendUint64(nil, uint64(rg.Want))); err != nil {
					return err
				}
			}
		}
		for t, g := range keep {
			if err := b.Put(append([]byte{'t'}, t...), []byte(g)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return db.Sync()
}

// restoredPlacements is topic → group of a restored directory: the
// placements of the old directory old in the groups restored, and each
// topic the state of a restored group holds. A topic two groups hold
// (which placement should prevent) stays where old placed it if that group
// holds it, else goes to the lowest id of the groups that hold it: the
// same on every run, whatever the order of a map.
func restoredPlacements(old *bolt.Bucket, groups map[string]RestoredGroup) (map[string]string, error) {
	placed := map[string]string{} // topic → group, as old placed it, of the groups restored
	err := old.ForEach(func(k, v []byte) error {
		if len(k) > 1 && k[0] == 't' {
			if _, ok := groups[string(v)]; ok {
				placed[string(k[1:])] = string(v)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	keep := maps.Clone(placed)
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		for _, t := range groups[g].Topics {
			d := keep[t]
			if d == "" || d == placed[t] && d != g && !slices.Contains(groups[d].Topics, t) {
				keep[t] = g
			}
		}
	}
	return keep, nil
}
