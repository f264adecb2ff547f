package group

import (
	"errors"
	"reflect"
	"testing"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// withSpans runs a test body with range lease records on, whichever run of
// the package this is.
func withSpans(t *testing.T) {
	t.Helper()
	was := testSpans
	testSpans = true
	t.Cleanup(func() { testSpans = was })
}

// layout counts a group's per-message records, its spans and the root
// expiry index's entries.
func layout(t *testing.T, db *bolt.DB, topic, name string) (records, spans, expiries int) {
	t.Helper()
	viewGroup(t, db, topic, name, func(tx *bolt.Tx, g *Group) {
		records = g.b.Bucket(bktState).Stats().KeyN
		if b := g.b.Bucket(bktSpans); b != nil {
			spans = b.Stats().KeyN
		}
		expiries = tx.Bucket(bktExpiry).Stats().KeyN
	})
	return records, spans, expiries
}

// A lease of new keyless messages writes one span and one expiry entry per
// partition, however many messages it hands out; acks clear them.
func TestSpanRecordsALeasePerPartition(t *testing.T) {
	withSpans(t)
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	mustPublish(t, db, "t", 0, 60, 1)
	mustPublish(t, db, "t", 1, 40, 1)
	ds := lease(t, db, "t", "g", 1000, 100, 100, 7)
	if len(ds) != 100 {
		t.Fatalf("leased %d, want 100", len(ds))
	}
	if r, s, e := layout(t, db, "t", "g"); r != 0 || s != 2 || e != 2 {
		t.Fatalf("after leasing 100 in 2 partitions: %d records, %d spans, %d expiry entries; want 0, 2, 2", r, s, e)
	}
	rs := receiptsOf(ds)
	if st := ack(t, db, "t", "g", 1001, 8, rs[:99]...); len(st) != 99 || st[0] != StatusOK || st[98] != StatusOK {
		t.Fatalf("ack = %v", st)
	}
	if r, s, e := layout(t, db, "t", "g"); r != 0 || s != 1 || e != 1 {
		t.Fatalf("one lease left: %d records, %d spans, %d expiry entries; want 0, 1, 1", r, s, e)
	}
	if st := ack(t, db, "t", "g", 1002, 9, rs...); st[0] != StatusStale || st[99] != StatusOK {
		t.Fatalf("second ack = %v, want stale ... ok", st)
	}
	if r, s, e := layout(t, db, "t", "g"); r != 0 || s != 0 || e != 0 {
		t.Fatalf("all acked: %d records, %d spans, %d expiry entries; want none", r, s, e)
	}
	if s := stats(t, db, "t", "g", 1003); s != (Stats{Acked: 100}) {
		t.Fatalf("stats = %+v", s)
	}
}

// Keyed and delayed messages keep records of their own inside a lease
// whose other messages share a span; a message that leaves the span
// (extended, nacked) gets a record, and the span's expiry covers the rest.
func TestSpanLeavesKeyedDelayedAndChangedMessagesToRecords(t *testing.T) {
	withSpans(t)
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublishKeys(t, db, "t", 0, "", "K", "", "", "")
	if err := db.Update(func(tx *bolt.Tx) error {
		part, err := mlog.OpenPartition(tx, "t", 0)
		if err != nil {
			return err
		}
		_, err = part.Append(&mlog.Message{PublishedAt: 1, DeliverAt: 5000, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ds := lease(t, db, "t", "g", 1000, 100, 10, 4)
	if got := placements(ds); !reflect.DeepEqual(got, []po{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}}) {
		t.Fatalf("lease = %v", got)
	}
	// 0/1 (keyed) and 0/5 (delayed) have records; 0/0, 0/2..4 one span.
	if r, s, e := layout(t, db, "t", "g"); r != 2 || s != 1 || e != 2 {
		t.Fatalf("%d records, %d spans, %d expiry entries; want 2, 1, 2", r, s, e)
	}
	rs := receiptsOf(ds)
	withGroup(t, db, "t", "g", func(g *Group) error {
		if st, err := g.Extend(1050, 1000, 5, rs[2:3]); err != nil || st[0] != StatusOK { // 0/2
			t.Fatalf("extend = %v, %v", st, err)
		}
		st, err := nack(g, 1050, 5, 10, rs[3]) // 0/3
		if err == nil && st[0] != StatusOK {
			t.Fatalf("nack = %v", st)
		}
		return err
	})
	if r, s, _ := layout(t, db, "t", "g"); r != 4 || s != 1 {
		t.Fatalf("after extend and nack: %d records, %d spans; want 4, 1", r, s)
	}
	// At 1100 the span's leases (0/0, 0/4) and the keyed one expire; the
	// extended one does not.
	due := dueLeases(t, db, 1100, 10)
	var got []po
	for _, e := range due {
		got = append(got, po{e.Partition, e.Offset})
		if e.Delivery != 4 {
			t.Errorf("due %d/%d has delivery %d, want 4", e.Partition, e.Offset, e.Delivery)
		}
	}
	if !reflect.DeepEqual(got, []po{{0, 0}, {0, 4}, {0, 1}}) && !reflect.DeepEqual(got, []po{{0, 1}, {0, 0}, {0, 4}}) {
		t.Fatalf("due at 1100 = %v, want the span's 0/0, 0/4 and keyed 0/1", got)
	}
	for _, e := range due {
		withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(e.Receipt, expireAt(1100)) })
	}
	if r, s, e := layout(t, db, "t", "g"); r != 6 || s != 0 || e != 1 {
		t.Fatalf("after expiry: %d records, %d spans, %d expiry entries; want 6, 0, 1", r, s, e)
	}
	if s := stats(t, db, "t", "g", 1100); s != (Stats{InFlight: 1, Backlog: 1, Delayed: 4}) {
		t.Fatalf("stats after expiry = %+v", s)
	}
	// The redeliveries carry their retry count.
	ds = lease(t, db, "t", "g", 2200, 100, 10, 9)
	if got := placements(ds); !reflect.DeepEqual(got, []po{{0, 3}, {0, 0}, {0, 1}, {0, 4}}) { // oldest due first
		t.Fatalf("redeliveries at 2200 = %v", got)
	}
	for _, d := range ds {
		if d.RetryCount != 1 {
			t.Errorf("redelivery of %d/%d has retry count %d, want 1", d.Partition, d.Offset, d.RetryCount)
		}
	}
}

// DueLeases hands out a span's leases up to its limit; the rest stay due.
func TestSpanDueLeasesLimit(t *testing.T) {
	withSpans(t)
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 5, 1)
	lease(t, db, "t", "g", 1000, 100, 10, 4)
	due := dueLeases(t, db, 1100, 3)
	if len(due) != 3 || due[0].Offset != 0 || due[2].Offset != 2 {
		t.Fatalf("due with limit 3 = %+v", due)
	}
	for _, e := range due {
		withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(e.Receipt, expireAt(1100)) })
	}
	due = dueLeases(t, db, 1100, 3)
	if len(due) != 2 || due[0].Offset != 3 || due[1].Offset != 4 {
		t.Fatalf("due after expiring three = %+v", due)
	}
}

// Trimming a partition's head clears the span bits below it, and the
// span's floor moves with its lowest lease.
func TestSpanTrimAndFloor(t *testing.T) {
	withSpans(t)
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 6, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 6, 4))
	ack(t, db, "t", "g", 1001, 5, rs[0], rs[2])
	floor := func() uint64 {
		var f uint64
		withGroup(t, db, "t", "g", func(g *Group) error {
			var err error
			f, err = g.Floor(0)
			return err
		})
		return f
	}
	if f := floor(); f != 1 {
		t.Fatalf("floor = %d, want 1", f)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.OnTrim(mlog.Trimmed{Partition: 0, NewFirst: 4}) })
	if f := floor(); f != 4 {
		t.Fatalf("floor after trim to 4 = %d, want 4", f)
	}
	if s := stats(t, db, "t", "g", 1002); s.InFlight != 2 {
		t.Fatalf("in flight after trim = %d, want 2", s.InFlight)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.OnTrim(mlog.Trimmed{Partition: 0, NewFirst: 6}) })
	if r, s, e := layout(t, db, "t", "g"); r != 0 || s != 0 || e != 0 {
		t.Fatalf("after trimming everything: %d records, %d spans, %d expiry entries", r, s, e)
	}
}

// A corrupt span is an error, never a panic.
func TestSpanCodec(t *testing.T) {
	s := &span{p: 3, first: 1 << 40, delivery: 99, until: 12345}
	for _, off := range []uint64{1 << 40, 1<<40 + 9, 1<<40 + 63} {
		s.set(off)
	}
	k := stateKey(s.p, s.first)
	got, err := decodeSpan(k, s.encode())
	if err != nil || got.delivery != 99 || got.until != 12345 || got.live != 3 ||
		!reflect.DeepEqual(got.offsets(), []uint64{1 << 40, 1<<40 + 9, 1<<40 + 63}) {
		t.Fatalf("span round trip = %+v, %v", got, err)
	}
	b := s.encode()
	for n := 0; n < len(b); n++ {
		if _, err := decodeSpan(k, b[:n]); !errors.Is(err, mlog.ErrCorrupt) {
			t.Fatalf("span prefix %d: err = %v", n, err)
		}
	}
	if _, err := decodeSpan(k[:5], b); !errors.Is(err, mlog.ErrCorrupt) {
		t.Fatalf("short key: err = %v", err)
	}
	wide := &span{p: 0, first: 0, bits: make([]byte, maxSpanBits/8+2)}
	if _, err := decodeSpan(stateKey(0, 0), wide.encode()); !errors.Is(err, mlog.ErrCorrupt) {
		t.Fatalf("too wide: err = %v", err)
	}
}

// A group whose leases were recorded per message (a state from before
// format 2) goes on after the switch: old and new leases are acked,
// expired and counted alike.
func TestSpansAfterRecords(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 10, 1)
	was := testSpans
	testSpans = false
	old := receiptsOf(lease(t, db, "t", "g", 1000, 100, 5, 4))
	testSpans = true
	t.Cleanup(func() { testSpans = was })
	cur := receiptsOf(lease(t, db, "t", "g", 1000, 200, 5, 5))
	if r, s, e := layout(t, db, "t", "g"); r != 5 || s != 1 || e != 6 {
		t.Fatalf("5 leased per message then 5 in a span: %d records, %d spans, %d expiry entries", r, s, e)
	}
	// One of each acked; the rest of the old ones expire first.
	if st := ack(t, db, "t", "g", 1001, 6, old[0], cur[0]); !reflect.DeepEqual(st, []string{StatusOK, StatusOK}) {
		t.Fatalf("ack = %v", st)
	}
	due := dueLeases(t, db, 1100, 100)
	if len(due) != 4 || due[0].Offset != 1 || due[3].Offset != 4 {
		t.Fatalf("due at 1100 = %+v, want the four old leases", due)
	}
	due = dueLeases(t, db, 1200, 100)
	if len(due) != 8 || due[4].Offset != 6 || due[7].Offset != 9 {
		t.Fatalf("due at 1200 = %+v, want the old four then the span's 6..9", due)
	}
	for _, e := range due {
		withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(e.Receipt, expireAt(1200)) })
	}
	if s := stats(t, db, "t", "g", 1200); s.InFlight != 0 || s.Acked != 2 || s.Delayed != 8 {
		t.Fatalf("stats after expiry = %+v", s)
	}
	if r, s, e := layout(t, db, "t", "g"); r != 8 || s != 0 || e != 0 {
		t.Fatalf("after expiry: %d records, %d spans, %d expiry entries; want 8, 0, 0", r, s, e)
	}
}
