package raftfsm

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// PrepareRestore installs the backup as a snapshot at the backup's applied
// index, with term 1 (a new cluster's terms start over: a higher snapshot
// term than the entries after it would break raft's election check), one
// voter, and no node addresses of the old cluster.
func TestPrepareRestoreSnapshot(t *testing.T) {
	src := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(src, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		m, _ := tx.CreateBucket(bktMeta)
		n, _ := tx.CreateBucket(bktNodes)
		_ = n.Put([]byte("old1"), []byte("x"))
		_ = m.Put(keyTerm, binary.BigEndian.AppendUint64(nil, 9))
		return m.Put(keyApplied, binary.BigEndian.AppendUint64(nil, 42))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "new")
	index, err := PrepareRestore(dir, bytes.NewReader(backup), "r1", "127.0.0.1:9")
	if err != nil || index != 42 {
		t.Fatalf("PrepareRestore: %d, %v; want 42", index, err)
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
	restored := filepath.Join(t.TempDir(), "restored.db")
	f, _ := os.Create(restored)
	_, err = f.ReadFrom(rc)
	rc.Close()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	db, err = bolt.Open(restored, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if i, term := metaApplied(tx); i != 42 || term != 1 {
			t.Errorf("restored state: applied %d term %d; want 42, 1", i, term)
		}
		if k, _ := tx.Bucket(bktNodes).Cursor().First(); k != nil {
			t.Errorf("restored state keeps the old node %q", k)
		}
		return nil
	})
	// Not empty any more: a second restore into it is refused.
	if _, err := PrepareRestore(dir, bytes.NewReader(backup), "r1", "127.0.0.1:9"); err == nil {
		t.Error("a restore into a used data dir succeeded")
	}
}
