package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
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
// into an unlinked temporary file in the data dir, and returns it for the
// caller to stream and close. The copy, not the transaction, is what a slow
// client reads: a read transaction held open keeps bbolt from growing its
// memory map, which would stall applies. The file needs the state's size
// in free space; below --min-free-disk plus that it answers
// ErrInsufficientStorage.
func (n *Node) Backup() (*Backup, error) {
	f := n.FSM
	f.mu.RLock()
	tx, err := f.db.Begin(false)
	f.mu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	b := &Backup{Size: tx.Size()}
	b.Index, b.Term = metaApplied(tx)
	n.disk.refresh(time.Now())
	if free, need := n.disk.free.Load(), n.disk.need.Load(); free < need+uint64(b.Size) {
		return nil, fmt.Errorf("%w: a backup needs %d bytes, %d free and %d kept free (--min-free-disk)",
			ErrInsufficientStorage, b.Size, free, need)
	}
	tmp, err := os.CreateTemp(n.cfg.DataDir, "backup-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	// Unlinked at once: a crash leaves nothing behind.
	if err := os.Remove(tmp.Name()); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup: %w", err)
	}
	if _, err := tx.WriteTo(tmp); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup copy: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("backup: %w", err)
	}
	b.File = tmp
	return b, nil
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

// restoredTerm is the raft term of the snapshot a restore installs: the
// restored node is a new cluster whose terms start over, and a snapshot
// term above the terms of the entries that follow it would let a node
// holding only the snapshot win an election against one holding the newer
// entries (raft compares the last entry's term first).
const restoredTerm = 1

// PrepareRestore makes dataDir, which must not exist or be empty, the data
// dir of a new single-node cluster holding the state in backup (what
// Backup wrote). The backup is installed as a raft snapshot at its applied
// index N, with a configuration of one voter (id, raftAddr), so that raft
// starts its log after N: the state records raft indexes (a lease's
// delivery is the index of the command that made it), and the state
// machine skips entries at or below its applied index, so a log that
// started again at 1 would be skipped. The node's first start restores the
// snapshot into fsm.db. The old cluster's node addresses are dropped (the
// new node records its own when it leads). It returns N.
func PrepareRestore(dataDir string, backup io.Reader, id, raftAddr string) (index uint64, err error) {
	if id == "" || raftAddr == "" {
		return 0, errors.New("restore: a node id and raft address are needed")
	}
	if err := ValidateNodeID(id); err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	if len(ents) > 0 {
		return 0, fmt.Errorf("restore: data dir %s is not empty: restore into a new directory", dataDir)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return 0, err
	}
	defer func() {
		lock.release()
		if err != nil { // leave the directory empty again, for another try
			ents, _ := os.ReadDir(dataDir)
			for _, e := range ents {
				_ = os.RemoveAll(filepath.Join(dataDir, e.Name()))
			}
		}
	}()
	tmp := filepath.Join(dataDir, "restore.db.tmp")
	defer os.Remove(tmp)
	if err := copyToFile(tmp, backup); err != nil {
		return 0, err
	}
	index, err = prepareState(tmp)
	if err != nil {
		return 0, err
	}
	store, err := raft.NewFileSnapshotStore(filepath.Join(dataDir, "snapshots"), 2, io.Discard)
	if err != nil {
		return 0, fmt.Errorf("restore: snapshot store: %w", err)
	}
	cfg := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(raftAddr)}}}
	// The transport only encodes the legacy peer list, as the TCP one
	// would (the address as bytes).
	_, enc := raft.NewInmemTransport("")
	sink, err := store.Create(raft.SnapshotVersionMax, index, restoredTerm, cfg, index, enc)
	if err != nil {
		return 0, fmt.Errorf("restore: snapshot: %w", err)
	}
	src, err := os.Open(tmp)
	if err != nil {
		_ = sink.Cancel()
		return 0, fmt.Errorf("restore: %w", err)
	}
	defer src.Close()
	if _, err := io.Copy(sink, src); err != nil {
		_ = sink.Cancel()
		return 0, fmt.Errorf("restore: snapshot: %w", err)
	}
	if err := sink.Close(); err != nil { // fsyncs the snapshot and its dir
		return 0, fmt.Errorf("restore: snapshot: %w", err)
	}
	return index, nil
}

func copyToFile(name string, r io.Reader) error {
	w, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return fmt.Errorf("restore: read backup: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// prepareState checks that path is an mqd state file with an applied
// index, drops the old cluster's node addresses, and sets the applied term
// to the restored snapshot's. It returns the applied index.
func prepareState(path string) (uint64, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoGrowSync: true})
	if err != nil {
		return 0, fmt.Errorf("restore: %w: %w", ErrNotBackup, err)
	}
	defer db.Close()
	var index uint64
	err = db.Update(func(tx *bolt.Tx) error {
		var term uint64
		index, term = metaApplied(tx)
		if index == 0 || term == 0 || tx.Bucket(bktNodes) == nil {
			return fmt.Errorf("%w: no applied index or node bucket", ErrNotBackup)
		}
		if err := tx.DeleteBucket(bktNodes); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bktNodes); err != nil {
			return err
		}
		return tx.Bucket(bktMeta).Put(keyTerm, binary.BigEndian.AppendUint64(nil, restoredTerm))
	})
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	if err := db.Sync(); err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	return index, nil
}
