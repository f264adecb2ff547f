package dedup

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func mustDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "d.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := Init(tx); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists([]byte("t"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return db
}

func mustUpdate(t *testing.T, db *bolt.DB, fn func(tx *bolt.Tx) error) {
	t.Helper()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func TestIndexWindowAndExpiryOrder(t *testing.T) {
	db := mustDB(t)
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		ix, err := Open(tx, tx.Bucket([]byte("t")), []byte("keys"), KindPublish, "orders", "")
		if err != nil {
			return err
		}
		for i, k := range []string{"c", "a", "b"} {
			if err := ix.Put([]byte(k), []byte{byte(i)}, int64(100*(i+1))); err != nil {
				return err
			}
		}
		// Replacing moves the expiry entry: "a" now expires at 50.
		if err := ix.Put([]byte("a"), []byte{9}, 50); err != nil {
			return err
		}
		if v, ok := ix.Get([]byte("a"), 49); !ok || v[0] != 9 {
			t.Errorf("Get(a, 49) = %v, %v; want [9], true", v, ok)
		}
		if _, ok := ix.Get([]byte("a"), 50); ok {
			t.Error("Get(a, 50) found a key whose window ended at 50")
		}
		if _, ok := ix.Get([]byte("zz"), 0); ok {
			t.Error("found a key never put")
		}
		return nil
	})
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		if HasDue(tx, 49) {
			t.Error("HasDue(49) with the earliest expiry at 50")
		}
		due, err := DueEntries(tx, 250, 10)
		if err != nil {
			return err
		}
		var got []string
		for _, d := range due {
			if d.Kind != KindPublish || d.Topic != "orders" || d.Group != "" {
				t.Errorf("due entry %+v: wrong namespace", d)
			}
			got = append(got, string(d.Key))
		}
		if want := []string{"a", "c", "b"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("DueEntries(250) = %v, want the first two of %v in time order", got, want)
		}
		ix, err := Open(tx, tx.Bucket([]byte("t")), []byte("keys"), KindPublish, "orders", "")
		if err != nil {
			return err
		}
		for _, d := range due {
			if err := ix.ExpireEntry(d); err != nil {
				return err
			}
		}
		if _, ok := ix.Get([]byte("b"), 0); !ok {
			t.Error("b expired early")
		}
		if ix.b.Get([]byte("a")) != nil || ix.b.Get([]byte("c")) != nil {
			t.Error("expired keys still stored")
		}
		rest, _ := DueEntries(tx, 1000, 10)
		if len(rest) != 1 || string(rest[0].Key) != "b" {
			t.Errorf("after expiry, due entries = %v, want only b", rest)
		}
		return nil
	})
}

func TestExpireEntryKeepsRenewedKey(t *testing.T) {
	db := mustDB(t)
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		ix, _ := Open(tx, tx.Bucket([]byte("t")), []byte("keys"), KindProcessed, "t", "g")
		if err := ix.Put([]byte("k"), nil, 10); err != nil {
			return err
		}
		stale := Due{Expires: 10, Kind: KindProcessed, Topic: "t", Group: "g", Key: []byte("k")}
		if err := ix.Put([]byte("k"), nil, 500); err != nil { // renewed
			return err
		}
		if err := ix.ExpireEntry(stale); err != nil {
			return err
		}
		if _, ok := ix.Get([]byte("k"), 100); !ok {
			t.Error("a stale expiry entry removed a renewed key")
		}
		return nil
	})
}

func TestProducerSequences(t *testing.T) {
	db := mustDB(t)
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		ps, err := OpenProducers(tx, tx.Bucket([]byte("t")), "t")
		if err != nil {
			return err
		}
		if c := ps.Check("p", 7, 0); c.Verdict != SeqNew {
			t.Errorf("unknown producer: %+v, want SeqNew", c)
		}
		for seq := uint64(7); seq < 7+SeqHistory+10; seq++ {
			if err := ps.Record("p", seq, 1, seq*10, 1000); err != nil {
				return err
			}
		}
		last := uint64(7 + SeqHistory + 9)
		cases := []struct {
			seq  uint64
			want Verdict
		}{{last + 1, SeqNew}, {last + 2, SeqGap}, {last, SeqDuplicate}, {last - SeqHistory + 1, SeqDuplicate},
			{last - SeqHistory, SeqTooOld}, {7, SeqTooOld}}
		for _, c := range cases {
			got := ps.Check("p", c.seq, 0)
			if got.Verdict != c.want {
				t.Errorf("Check(%d) = %+v, want verdict %d", c.seq, got, c.want)
			}
			if c.want == SeqDuplicate && (got.Partition != 1 || got.Offset != c.seq*10) {
				t.Errorf("Check(%d) placement = %d/%d, want 1/%d", c.seq, got.Partition, got.Offset, c.seq*10)
			}
			if c.want == SeqGap && got.Expected != last+1 {
				t.Errorf("gap expected %d, want %d", got.Expected, last+1)
			}
		}
		// Past its expiry the producer is unknown again.
		if c := ps.Check("p", 3, 1000); c.Verdict != SeqNew {
			t.Errorf("expired producer: %+v, want SeqNew", c)
		}
		due, err := DueEntries(tx, 1000, 10)
		if err != nil || len(due) != 1 {
			t.Fatalf("due = %v, %v; want the producer's one entry", due, err)
		}
		if err := ps.Expire(due[0]); err != nil {
			return err
		}
		n := 0
		_ = ps.hist.ForEach(func(k, v []byte) error { n++; return nil })
		if n != 0 {
			t.Errorf("%d history entries left after the producer expired", n)
		}
		return nil
	})
}
