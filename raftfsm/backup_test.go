package raftfsm

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// PrepareRestore installs the backup as a snapshot at the backup's applied
// index, with term 1 (a new cluster's terms start over: a higher snapshot
// term than the entries after it would break raft's election check), one
// voter, and no node addresses of the old cluster.
func TestPrepareRestoreSnapshot(t *testing.T) {
	src := filepath.Join(t.TempDir(), "state.db")
	f, err := fsm.OpenFSM(src, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	old := &command.Command{Op: command.OpSetNode, Now: 1, Node: command.NodeInfo{ID: "old1"}}
	if r, _ := f.Apply(&raft.Log{Index: 42, Term: 9, Type: raft.LogCommand, Data: old.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
		t.Fatalf("apply: %+v", r)
	}
	b, err := f.Backup(t.TempDir(), func(int64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	backup, err := io.ReadAll(b.File)
	b.File.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "new")
	res, err := PrepareRestore(dir, bytes.NewReader(backup), "r1", "127.0.0.1:9")
	if err != nil || res.Index != 42 || len(res.Groups) != 0 {
		t.Fatalf("PrepareRestore: %+v, %v; want index 42 and no data group", res, err)
	}
	store, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 2, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	metas, err := store.List()
	if err != nil || len(metas) != 1 {
		t.Fatalf("snapshots: %v, %v", metas, err)
	}
	m := metas[0]
	if m.Index != 42 || m.Term != 1 || len(m.Configuration.Servers) != 1 ||
		m.Configuration.Servers[0].ID != "r1" || m.Configuration.Servers[0].Suffrage != raft.Voter {
		t.Fatalf("snapshot meta: index %d term %d config %+v", m.Index, m.Term, m.Configuration)
	}
	_, rc, err := store.Open(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Restored as the node's first start restores it: into a new fsm.db.
	r, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(rc); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if i, term := r.AppliedIndexTerm(); i != 42 || term != 1 {
		t.Errorf("restored state: applied %d term %d; want 42, 1", i, term)
	}
	if nodes := r.Nodes(); len(nodes) != 0 {
		t.Errorf("restored state keeps the old nodes %v", nodes)
	}
	// Not empty any more: a second restore into it is refused.
	if _, err := PrepareRestore(dir, bytes.NewReader(backup), "r1", "127.0.0.1:9"); err == nil {
		t.Error("a restore into a used data dir succeeded")
	}
}
