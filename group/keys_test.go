package group

import (
	"reflect"
	"testing"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// mustPublishKeys appends one message per idempotency key ("" for none) to
// partition p.
func mustPublishKeys(t testing.TB, db *bolt.DB, topic string, p uint32, keys ...string) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		part, err := mlog.OpenPartition(tx, topic, p)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if _, err := part.Append(&mlog.Message{PublishedAt: 1, IdempotencyKey: k, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte(k)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func mustPatchTopic(t testing.TB, db *bolt.DB, topic string, p mlog.Patch) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := mlog.PutTopic(tx, topic, p)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestKeyHeldWhileLeasedThenSkippedOnAck(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublishKeys(t, db, "t", 0, "K", "K", "L")
	ds := lease(t, db, "t", "g", 1000, 100, 10, 3)
	if got := placements(ds); !reflect.DeepEqual(got, []po{{0, 0}, {0, 2}}) {
		t.Fatalf("lease = %v, want 0/0 and 0/2 (0/1 held behind key K)", got)
	}
	if s := stats(t, db, "t", "g", 1000); s != (Stats{Backlog: 1, InFlight: 2}) {
		t.Fatalf("stats with one held = %+v", s)
	}
	if ds := lease(t, db, "t", "g", 1001, 100, 10, 4); len(ds) != 0 {
		t.Fatalf("held message delivered while its key is leased: %v", placements(ds))
	}
	ack(t, db, "t", "g", 1002, 5, receiptsOf(ds[:1])...)
	if s := stats(t, db, "t", "g", 1002); s != (Stats{InFlight: 1, Acked: 1, DuplicatesSkipped: 1}) {
		t.Fatalf("stats after acking K = %+v, want the held copy skipped", s)
	}
	// A later message with K is skipped too, within the window.
	mustPublishKeys(t, db, "t", 0, "K", "M")
	ds = lease(t, db, "t", "g", 1003, 100, 10, 6)
	if got := placements(ds); !reflect.DeepEqual(got, []po{{0, 4}}) {
		t.Fatalf("lease after K was processed = %v, want only 0/4", got)
	}
	if s := stats(t, db, "t", "g", 1003); s.DuplicatesSkipped != 2 {
		t.Fatalf("duplicates_skipped = %d, want 2", s.DuplicatesSkipped)
	}
	// Another group has processed nothing.
	if ds := lease(t, db, "t", "other", 1003, 100, 10, 7); len(ds) != 3 {
		t.Fatalf("other group leased %v, want one message per key (K, L, M)", placements(ds))
	}
}

func TestKeyHeldReturnsOnExpiry(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublishKeys(t, db, "t", 0, "K", "K")
	ds := lease(t, db, "t", "g", 1000, 100, 10, 3)
	if len(ds) != 1 || ds[0].Offset != 0 {
		t.Fatalf("lease = %v", placements(ds))
	}
	// 0/0 waits out its backoff (until 2100); 0/1 is free to go at once.
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(receiptsOf(ds)[0], expireAt(1100)) })
	if s := stats(t, db, "t", "g", 1100); s != (Stats{Backlog: 1, Delayed: 1}) {
		t.Fatalf("stats after expiry = %+v", s)
	}
	ds = lease(t, db, "t", "g", 1100, 5000, 10, 4)
	if len(ds) != 1 || ds[0].Offset != 1 || ds[0].RetryCount != 0 {
		t.Fatalf("lease after expiry = %+v, want the held 0/1", ds)
	}
	// Once 0/0 is due, it is held behind 0/1 (which holds K).
	if ds := lease(t, db, "t", "g", 2100, 100, 10, 5); len(ds) != 0 {
		t.Fatalf("0/0 delivered while 0/1 holds its key: %+v", ds)
	}
	ack(t, db, "t", "g", 2101, 6, receiptsOf(ds)...)
	if s := stats(t, db, "t", "g", 2101); s != (Stats{Acked: 1, DuplicatesSkipped: 1}) {
		t.Fatalf("stats after acking K = %+v, want the held retry skipped", s)
	}
}

func TestProcessedKeyExpiresWithWindow(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPatchTopic(t, db, "t", mlog.Patch{DedupWindowMs: ptr(int64(1000))})
	mustPublishKeys(t, db, "t", 0, "K")
	ack(t, db, "t", "g", 1001, 4, receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 3))...) // K processed until 2001
	mustPublishKeys(t, db, "t", 0, "K")
	if ds := lease(t, db, "t", "g", 2000, 100, 10, 5); len(ds) != 0 {
		t.Fatalf("K delivered inside the window: %v", placements(ds))
	}
	mustPublishKeys(t, db, "t", 0, "K")
	if ds := lease(t, db, "t", "g", 2001, 100, 10, 6); len(ds) != 1 || ds[0].Offset != 2 {
		t.Fatalf("K after the window = %v, want 0/2", placements(ds))
	}
}

func TestHeldMessageFreedWhenHolderTrimmed(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublishKeys(t, db, "t", 0, "K", "K")
	if ds := lease(t, db, "t", "g", 1000, 100, 10, 3); len(ds) != 1 || ds[0].Offset != 0 {
		t.Fatalf("lease = %v, want 0/0 (0/1 held)", placements(ds))
	}
	// Retention or drop-head removes the leased holder of K.
	if err := db.Update(func(tx *bolt.Tx) error {
		p, _ := mlog.OpenPartition(tx, "t", 0)
		_, err := p.TrimTo(1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.OnTrim(mlog.Trimmed{Partition: 0, NewFirst: 1}) })
	ds := lease(t, db, "t", "g", 1<<40, 100, 10, 4)
	if len(ds) != 1 || ds[0].Offset != 1 {
		t.Fatalf("lease after the holder was trimmed = %v, want the held 0/1", placements(ds))
	}
}
