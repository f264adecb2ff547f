package raftfsm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/fsm"
)

// restoredTerm is the raft term of the snapshot a restore installs: the
// restored node is a new cluster whose terms start over, and a snapshot
// term above the terms of the entries that follow it would let a node
// holding only the snapshot win an election against one holding the newer
// entries (raft compares the last entry's term first).
const restoredTerm = 1

// Restored is what PrepareRestore installed: the metadata (default)
// group's state at Index and, from an archive, each data group's at its
// own index.
type Restored struct {
	Index  uint64
	Groups map[string]uint64
}

// PrepareRestore makes dataDir, which must not exist or be empty, the data
// dir of a new single-node cluster holding the state in backup (what
// Backup wrote, or an archive of every group: archive.go). The backup is
// installed as a raft snapshot at its applied index N, with a
// configuration of one voter (id, raftAddr), so that raft starts its log
// after N: the state records raft indexes (a lease's delivery is the index
// of the command that made it), and the state machine skips entries at or
// below its applied index, so a log that started again at 1 would be
// skipped. The node's first start restores the snapshot into fsm.db. The
// old cluster's node addresses are dropped (the new node records its own
// when it leads). Each data group of an archive is installed the same way
// under groups/<id>/, at its own index, with the same one voter.
func PrepareRestore(dataDir string, backup io.Reader, id, raftAddr string) (res *Restored, err error) {
	if id == "" || raftAddr == "" {
		return nil, errors.New("restore: a node id and raft address are needed")
	}
	if err := ValidateNodeID(id); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if len(ents) > 0 {
		return nil, fmt.Errorf("restore: data dir %s is not empty: restore into a new directory", dataDir)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		// bbolt panics on some damaged pages of a file it opens (an
		// assertion on a page's id or type): here that is bad input, a
		// refusal like any other, not a crash that leaves the files.
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("restore: %w: a state file is damaged (%v)", fsm.ErrNotBackup, p)
		}
		lock.release()
		if err != nil { // leave the directory empty again, for another try
			ents, _ := os.ReadDir(dataDir)
			for _, e := range ents {
				_ = os.RemoveAll(filepath.Join(dataDir, e.Name()))
			}
		}
	}()
	br := bufio.NewReaderSize(backup, 64<<10)
	if head, _ := br.Peek(512); isArchive(head) {
		return restoreArchive(dataDir, br, id, raftAddr)
	}
	tmp := filepath.Join(dataDir, "restore.db.tmp")
	defer os.Remove(tmp)
	if err := copyToFile(tmp, br); err != nil {
		return nil, err
	}
	index, err := fsm.PrepareState(tmp, restoredTerm)
	if err != nil {
		return nil, err
	}
	if err := installSnapshot(dataDir, tmp, index, id, raftAddr); err != nil {
		return nil, err
	}
	return &Restored{Index: index}, nil
}

// installSnapshot installs the prepared state file at path as the raft
// snapshot at index of the group whose directory is dir, with a
// configuration of one voter (id, raftAddr).
func installSnapshot(dir, path string, index uint64, id, raftAddr string) error {
	store, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 2, io.Discard)
	if err != nil {
		return fmt.Errorf("restore: snapshot store: %w", err)
	}
	cfg := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(raftAddr)}}}
	// The transport only encodes the legacy peer list, as the TCP one
	// would (the address as bytes).
	_, enc := raft.NewInmemTransport("")
	sink, err := store.Create(raft.SnapshotVersionMax, index, restoredTerm, cfg, index, enc)
	if err != nil {
		return fmt.Errorf("restore: snapshot: %w", err)
	}
	src, err := os.Open(path)
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("restore: %w", err)
	}
	defer src.Close()
	if _, err := io.Copy(sink, src); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("restore: snapshot: %w", err)
	}
	if err := sink.Close(); err != nil { // fsyncs the snapshot and its dir
		return fmt.Errorf("restore: snapshot: %w", err)
	}
	return nil
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

// Backup copies the state machine (fsm.FSM.Backup) into the data dir,
// refused with ErrInsufficientStorage when the copy would leave less free
// space than --min-free-disk.
func (n *Node) Backup() (*fsm.Backup, error) {
	return n.FSM.Backup(n.cfg.DataDir, n.backupRoom)
}

// GroupBackup is Backup of data group id's state as this node's replica
// holds it; held false when this node holds none, or one that is not a
// voter of the group (a new replica of a move may still be installing its
// first snapshot: its state would miss what the group holds).
func (n *Node) GroupBackup(id string) (b *fsm.Backup, held bool, err error) {
	g := n.Group(id)
	if g == nil {
		return nil, false, nil
	}
	servers, err := g.Servers()
	if err != nil {
		return nil, false, nil
	}
	if !slices.ContainsFunc(servers, func(s raft.Server) bool {
		return string(s.ID) == n.cfg.ID && s.Suffrage == raft.Voter
	}) {
		return nil, false, nil
	}
	b, err = g.FSM().Backup(n.cfg.DataDir, n.backupRoom)
	return b, true, err
}

// SpoolBackup copies the size bytes of a group's copy read from r
// (another member's answer) into an unlinked temporary file in the data
// dir, positioned at its start, with the room Backup asks for.
func (n *Node) SpoolBackup(r io.Reader, size int64) (*os.File, error) {
	if err := n.backupRoom(size); err != nil {
		return nil, err
	}
	return fsm.Spool(n.cfg.DataDir, func(w io.Writer) error {
		_, err := io.CopyN(w, r, size)
		return err
	})
}

// backupRoom refuses a copy of size bytes that would leave less free
// space than --min-free-disk.
func (n *Node) backupRoom(size int64) error {
	n.disk.refresh(time.Now())
	if free, need := n.disk.free.Load(), n.disk.need.Load(); free < need+uint64(size) {
		return fmt.Errorf("%w: a backup needs %d bytes, %d free and %d kept free (--min-free-disk)",
			ErrInsufficientStorage, size, free, need)
	}
	return nil
}
