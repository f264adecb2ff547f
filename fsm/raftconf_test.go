package fsm

import (
	"bytes"
	"testing"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// The latest configuration entry applied is kept with the state, so that
// raft can start at the state's applied index (replica/startsnap.go);
// one replayed at or below that index changes nothing, and a backup
// prepared for a new cluster drops the old cluster's.
func TestFSMRecordsRaftConfiguration(t *testing.T) {
	h := mustFSM(t)
	if _, _, _, _, ok := h.f.StartPoint(); ok {
		t.Fatal("a new state has a raft configuration")
	}
	conf := func(ids ...string) []byte {
		var c raft.Configuration
		for _, id := range ids {
			c.Servers = append(c.Servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":1")})
		}
		return raft.EncodeConfiguration(c)
	}
	three, two := conf("a", "b", "c"), conf("a", "b")
	h.f.ApplyBatch([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: three}})
	h.idx = 1
	h.apply(publish(1, "t", msg("x"))) // refused (no topic), applied all the same
	h.f.ApplyBatch([]*raft.Log{{Index: 3, Term: 2, Type: raft.LogConfiguration, Data: two},
		{Index: 4, Term: 2, Type: raft.LogCommand, Data: publish(2, "t", msg("y")).Encode()}})
	h.idx = 4
	h.f.ApplyBatch([]*raft.Log{{Index: 3, Term: 2, Type: raft.LogConfiguration, Data: three}}) // a replay: already applied
	index, term, ci, data, ok := h.f.StartPoint()
	if !ok || index != 4 || term != 2 || ci != 3 || !bytes.Equal(data, two) {
		t.Fatalf("StartPoint = %d %d %d %x %v, want 4 2 3 (the two-server configuration) true", index, term, ci, data, ok)
	}

	path := h.f.path
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := PrepareState(path, 1); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktMeta).Get(keyRaftConf); v != nil {
			t.Errorf("a state prepared for a new cluster keeps the old one's raft configuration (%d bytes)", len(v))
		}
		return nil
	})
}
