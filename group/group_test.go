package group

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/dlq"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

func ptr[T any](v T) *T { return &v }

// testSpans runs the package's tests a second time with range lease
// records on (UseSpans): every rule must hold in both layouts.
var testSpans bool

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 && flag.Lookup("test.bench").Value.String() == "" {
		fmt.Println("--- again, with range lease records (UseSpans)")
		testSpans = true
		code = m.Run()
	}
	os.Exit(code)
}

// mustDB opens a database with the root buckets of log, dedup and group
// (as the state machine creates them).
func mustDB(t testing.TB) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "group.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := mlog.Init(tx); err != nil {
			return err
		}
		if err := dedup.Init(tx); err != nil {
			return err
		}
		return Init(tx)
	}); err != nil {
		t.Fatal(err)
	}
	return db
}

func mustTopic(t testing.TB, db *bolt.DB, topic string, parts uint32) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := mlog.PutTopic(tx, topic, mlog.Patch{Partitions: &parts})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// mustPublish appends n messages to partition p, published at `at`.
func mustPublish(t testing.TB, db *bolt.DB, topic string, p uint32, n int, at int64) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		part, err := mlog.OpenPartition(tx, topic, p)
		if err != nil {
			return err
		}
		for range n {
			if _, err := part.Append(&mlog.Message{PublishedAt: at, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte("v")}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// withGroup runs fn on group name of topic in a write transaction, creating
// the group if needed, and checks the group's bookkeeping afterwards.
func withGroup(t testing.TB, db *bolt.DB, topic, name string, fn func(g *Group) error) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		l, err := mlog.Open(tx, topic)
		if err != nil {
			return err
		}
		g, err := Open(tx, l, name, true, 1)
		if err != nil {
			return err
		}
		if testSpans {
			g.UseSpans()
		}
		if err := fn(g); err != nil {
			return err
		}
		return g.Save()
	}); err != nil {
		t.Fatal(err)
	}
	checkConsistent(t, db, topic, name)
}

// checkConsistent verifies that a group's counters and indexes agree with
// its records.
func checkConsistent(t testing.TB, db *bolt.DB, topic, name string) {
	t.Helper()
	viewGroup(t, db, topic, name, func(tx *bolt.Tx, g *Group) {
		var leased, ready, held uint64
		err := g.forEachRecord(func(p uint32, off uint64, r record) error {
			switch r.State {
			case stateLeased:
				leased++
				if tx.Bucket(bktExpiry).Get(expiryKey(r.Until, p, off, topic, name)) == nil {
					t.Errorf("leased %d/%d has no expiry index entry", p, off)
				}
				if r.Key != "" && !bytes.Equal(g.b.Bucket(bktLeasedBy).Get([]byte(r.Key)), stateKey(p, off)) {
					t.Errorf("leased %d/%d does not hold its key %q", p, off, r.Key)
				}
			case stateHeld:
				held++
				if g.b.Bucket(bktHeld).Get(heldKey(r.Key, p, off)) == nil {
					t.Errorf("held %d/%d has no held index entry", p, off)
				}
			case stateReady:
				ready++
				if g.b.Bucket(bktReady).Get(timedKey(r.Until, p, off)) == nil {
					t.Errorf("ready %d/%d has no ready index entry", p, off)
				}
			case stateDead:
			default:
				t.Errorf("record %d/%d has state %d", p, off, r.State)
			}
			next, _ := g.cursor(p)
			if off >= next {
				t.Errorf("record %d/%d at or past the cursor %d", p, off, next)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		leased += checkSpans(t, tx, g)
		if g.c.InFlight != leased || g.c.Ready != ready || g.c.Held != held {
			t.Errorf("counters in_flight=%d ready=%d held=%d, records leased=%d ready=%d held=%d",
				g.c.InFlight, g.c.Ready, g.c.Held, leased, ready, held)
		}
		if n := uint64(g.b.Bucket(bktReady).Stats().KeyN); n != ready {
			t.Errorf("ready index holds %d entries, records %d", n, ready)
		}
		if n := uint64(g.b.Bucket(bktHeld).Stats().KeyN); n != held {
			t.Errorf("held index holds %d entries, records %d", n, held)
		}
	})
}

// viewGroup runs fn on group name of topic in a read transaction.
func viewGroup(t testing.TB, db *bolt.DB, topic, name string, fn func(tx *bolt.Tx, g *Group)) {
	t.Helper()
	_ = db.View(func(tx *bolt.Tx) error {
		l, err := mlog.Open(tx, topic)
		if err != nil {
			t.Fatal(err)
		}
		g, err := Open(tx, l, name, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		fn(tx, g)
		return nil
	})
}

// checkSpans verifies the group's spans: each has an expiry entry and a
// bit set, its bits lie below the cursor, and no message is both in a span
// and in a record. It answers the number of messages leased under spans.
func checkSpans(t testing.TB, tx *bolt.Tx, g *Group) uint64 {
	t.Helper()
	var leased uint64
	seen := map[[2]uint64]bool{}
	err := g.forEachSpan(func(s *span) error {
		if s.live == 0 || len(s.offsets()) != s.live {
			t.Errorf("span %d/%d: live=%d, offsets %v", s.p, s.first, s.live, s.offsets())
		}
		if tx.Bucket(bktExpiry).Get(spanExpiryKey(s, g.log.Topic, g.Name)) == nil {
			t.Errorf("span %d/%d has no expiry index entry", s.p, s.first)
		}
		next, _ := g.cursor(s.p)
		for _, off := range s.offsets() {
			leased++
			if off >= next {
				t.Errorf("span %d/%d leases %d at or past the cursor %d", s.p, s.first, off, next)
			}
			if g.b.Bucket(bktState).Get(stateKey(s.p, off)) != nil {
				t.Errorf("%d/%d is both in span %d and in a record", s.p, off, s.first)
			}
			if k := [2]uint64{uint64(s.p), off}; seen[k] {
				t.Errorf("%d/%d is in two spans", s.p, off)
			} else {
				seen[k] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every span entry in the expiry index belongs to a span.
	c := tx.Bucket(bktExpiry).Cursor()
	suffix := append([]byte(g.log.Topic+"\x00"+g.Name), 0)
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if bytes.Equal(k[20:], suffix) && g.b.Bucket(bktSpans).Get(k[8:20]) == nil {
			t.Errorf("span expiry entry %x has no span", k)
		}
	}
	return leased
}

// nack fails receipts as retryable, due again after delayMs.
func nack(g *Group, now int64, idx uint64, delayMs int64, rs ...Receipt) ([]string, error) {
	fs := make([]Failure, len(rs))
	for i := range fs {
		fs[i] = Failure{Failure: dlq.Failure{At: now, Kind: dlq.KindNack, Reason: "test"}, Retryable: true, DelayMs: delayMs}
	}
	return g.Nack(now, idx, rs, fs)
}

// expireAt is the failure the leader's sweeper reports at now (rand 0: no jitter).
func expireAt(now int64) Failure { return Failure{Failure: dlq.Failure{At: now, Node: "n1"}} }

func receiptsOf(ds []Delivery) []Receipt {
	out := make([]Receipt, len(ds))
	for i, d := range ds {
		out[i] = Receipt{Partition: d.Partition, Offset: d.Offset, Delivery: d.Delivery}
	}
	return out
}

func lease(t testing.TB, db *bolt.DB, topic, name string, now, leaseMs int64, max int, idx uint64) []Delivery {
	t.Helper()
	var ds []Delivery
	withGroup(t, db, topic, name, func(g *Group) error {
		var err error
		ds, err = g.Lease(now, leaseMs, max, idx, false)
		return err
	})
	return ds
}

func ack(t testing.TB, db *bolt.DB, topic, name string, now int64, idx uint64, rs ...Receipt) []string {
	t.Helper()
	var st []string
	withGroup(t, db, topic, name, func(g *Group) error {
		var err error
		st, err = g.Ack(now, idx, rs)
		return err
	})
	return st
}

func stats(t testing.TB, db *bolt.DB, topic, name string, now int64) Stats {
	t.Helper()
	var s Stats
	_ = db.View(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, topic)
		g, err := Open(tx, l, name, false, 0)
		if err != nil {
			t.Fatal(err)
		}
		if s, err = g.Stats(now); err != nil {
			t.Fatal(err)
		}
		return nil
	})
	return s
}

type po struct {
	p   uint32
	off uint64
}

func placements(ds []Delivery) []po {
	out := make([]po, len(ds))
	for i, d := range ds {
		out[i] = po{d.Partition, d.Offset}
	}
	return out
}

func TestLeaseRoundRobin(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 3)
	for p := uint32(0); p < 3; p++ {
		mustPublish(t, db, "t", p, 2, 1)
	}
	ds := lease(t, db, "t", "g", 1000, 100, 6, 7) // 7 mod 3: start at partition 1
	want := []po{{1, 0}, {2, 0}, {0, 0}, {1, 1}, {2, 1}, {0, 1}}
	if got := placements(ds); !reflect.DeepEqual(got, want) {
		t.Fatalf("lease order = %v, want %v", got, want)
	}
	for _, d := range ds {
		if d.Delivery != 7 || d.RetryCount != 0 {
			t.Fatalf("delivery %+v: want Delivery 7, RetryCount 0", d)
		}
	}
	if ds := lease(t, db, "t", "g", 1001, 100, 10, 8); len(ds) != 0 {
		t.Fatalf("second lease while all are leased = %v, want none", placements(ds))
	}
	mustPublish(t, db, "t", 2, 1, 2)
	if got := placements(lease(t, db, "t", "g", 1002, 100, 10, 9)); !reflect.DeepEqual(got, []po{{2, 2}}) {
		t.Fatalf("lease after one more publish = %v, want [{2 2}]", got)
	}
	// Another group sees every message too.
	if ds := lease(t, db, "t", "other", 1002, 100, 100, 10); len(ds) != 7 {
		t.Fatalf("second group leased %d messages, want 7", len(ds))
	}
}

// With RotatePartitions, leases of one message each alternate over the
// partitions whatever their raft indexes (all even here, as when fetches
// alternate with acks); without it, a lease starts at its index mod
// partitions and the same indexes drain partition 0 first.
func TestLeaseRotatesAcrossLeases(t *testing.T) {
	for _, rotate := range []bool{true, false} {
		db := mustDB(t)
		mustTopic(t, db, "t", 2)
		for p := uint32(0); p < 2; p++ {
			mustPublish(t, db, "t", p, 3, 1)
		}
		var got []po
		for i := range 6 {
			withGroup(t, db, "t", "g", func(g *Group) error {
				if rotate {
					g.RotatePartitions()
				}
				ds, err := g.Lease(1000, 100000, 1, uint64(10+2*i), false)
				got = append(got, placements(ds)...)
				return err
			})
		}
		want := []po{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}}
		if !rotate {
			want = []po{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rotate %v: leases of one took %v, want %v", rotate, got, want)
		}
	}
}

func TestLeaseMaxAndNoDuplicates(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 3)
	mustPublish(t, db, "t", 0, 3, 1)
	mustPublish(t, db, "t", 1, 1, 1)
	mustPublish(t, db, "t", 2, 2, 1)
	seen := map[po]bool{}
	var order [][]po
	for idx := uint64(3); idx < 10; idx++ {
		ds := lease(t, db, "t", "g", 1000, 60000, 2, idx)
		if len(ds) > 2 {
			t.Fatalf("lease with max 2 returned %d", len(ds))
		}
		order = append(order, placements(ds))
		for _, d := range ds {
			k := po{d.Partition, d.Offset}
			if seen[k] {
				t.Fatalf("message %v leased twice; leases: %v", k, order)
			}
			seen[k] = true
		}
	}
	if len(seen) != 6 {
		t.Fatalf("leased %d distinct messages, want 6; leases: %v", len(seen), order)
	}
	// idx 3 starts at partition 0, idx 4 at partition 1.
	want := [][]po{{{0, 0}, {1, 0}}, {{2, 0}, {0, 1}}}
	if !reflect.DeepEqual(order[:2], want) {
		t.Fatalf("first leases = %v, want %v", order[:2], want)
	}
	if ds := lease(t, db, "t", "g", 1000, 60000, 0, 11); len(ds) != 0 {
		t.Fatalf("max 0 leased %v", ds)
	}
}

func TestAckOkThenStale(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 2, 1)
	ds := lease(t, db, "t", "g", 1000, 100, 10, 5)
	rs := receiptsOf(ds)
	if st := ack(t, db, "t", "g", 1050, 6, rs[0]); !reflect.DeepEqual(st, []string{StatusOK}) {
		t.Fatalf("first ack = %v, want [ok]", st)
	}
	if st := ack(t, db, "t", "g", 1051, 7, rs[0], rs[1]); !reflect.DeepEqual(st, []string{StatusStale, StatusOK}) {
		t.Fatalf("second ack = %v, want [stale ok]", st)
	}
	s := stats(t, db, "t", "g", 1052)
	if s != (Stats{Acked: 2}) {
		t.Fatalf("stats after acks = %+v", s)
	}
}

func TestAckAfterLeaseExpiryIsStale(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5)) // until 1100
	st := ack(t, db, "t", "g", 1099, 6, rs[0])
	if !reflect.DeepEqual(st, []string{StatusOK}) {
		t.Fatalf("ack just before expiry = %v", st)
	}
	st = ack(t, db, "t", "g", 1100, 7, rs[1]) // exactly at Until: expired
	if !reflect.DeepEqual(st, []string{StatusStale}) {
		t.Fatalf("ack at expiry = %v, want [stale]", st)
	}
	if s := stats(t, db, "t", "g", 1100); s.Acked != 1 || s.InFlight != 1 {
		t.Fatalf("a stale ack changed state: %+v", s)
	}
}

func TestAckInvalidReceipts(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 1, 4)) // leases 0/0
	cases := []struct {
		name string
		r    Receipt
		want string
	}{
		{"offset beyond partition end", Receipt{Partition: 0, Offset: 2, Delivery: 4}, StatusInvalid},
		{"offset far beyond end", Receipt{Partition: 0, Offset: 1 << 60, Delivery: 4}, StatusInvalid},
		{"empty partition", Receipt{Partition: 1, Offset: 0, Delivery: 4}, StatusInvalid},
		{"partition out of range", Receipt{Partition: 2, Offset: 0, Delivery: 4}, StatusInvalid},
		{"delivery from the future", Receipt{Partition: 0, Offset: 0, Delivery: 99}, StatusInvalid},
		{"other delivery of a leased message", Receipt{Partition: 0, Offset: 0, Delivery: 3}, StatusStale},
		{"the real one", rs[0], StatusOK},
	}
	var in []Receipt
	var want []string
	for _, c := range cases {
		in = append(in, c.r)
		want = append(want, c.want)
	}
	got := ack(t, db, "t", "g", 1001, 5, in...)
	for i, c := range cases {
		if got[i] != want[i] {
			t.Errorf("%s: %q, want %q", c.name, got[i], want[i])
		}
	}
}

func TestAckReceiptNeverDeliveredToGroup(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 3, 1)
	lease(t, db, "t", "g", 1000, 100, 1, 4) // cursor now 1
	st := ack(t, db, "t", "g", 1001, 5, Receipt{Partition: 0, Offset: 2, Delivery: 4})
	if !reflect.DeepEqual(st, []string{StatusInvalid}) {
		t.Fatalf("ack of never-delivered offset = %v, want [invalid]", st)
	}
}

func TestExtend(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5)) // until 1100
	var st []string
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = g.Extend(1050, 500, 6, rs[:1]) // until 1550
		return err
	})
	if !reflect.DeepEqual(st, []string{StatusOK}) {
		t.Fatalf("extend = %v", st)
	}
	// The extended lease outlives the original expiry; the other does not.
	if st := ack(t, db, "t", "g", 1200, 7, rs...); !reflect.DeepEqual(st, []string{StatusOK, StatusStale}) {
		t.Fatalf("ack after the original expiry = %v, want [ok stale]", st)
	}
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = g.Extend(1300, 500, 8, rs)
		return err
	})
	if !reflect.DeepEqual(st, []string{StatusStale, StatusStale}) {
		t.Fatalf("extend of acked and expired leases = %v", st)
	}
}

func TestExtendMovesExpiryIndex(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 1, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5))
	withGroup(t, db, "t", "g", func(g *Group) error {
		_, err := g.Extend(1050, 1000, 6, rs)
		return err
	})
	if due := dueLeases(t, db, 1100, 10); len(due) != 0 {
		t.Fatalf("extended lease still due at the old expiry: %+v", due)
	}
	if due := dueLeases(t, db, 2050, 10); len(due) != 1 || due[0].Receipt != rs[0] {
		t.Fatalf("DueLeases at the new expiry = %+v", due)
	}
}

func dueLeases(t testing.TB, db *bolt.DB, now int64, limit int) []Expired {
	t.Helper()
	var out []Expired
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = DueLeases(tx, now, limit)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestExpireLeaseRedeliversAfterBackoff(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1) // defaults: backoff 1000 ms doubling, max_retry 5
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5)) // until 1100
	// Not yet expired: nothing changes.
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], expireAt(1099)) })
	if s := stats(t, db, "t", "g", 1099); s.InFlight != 2 || s.Backlog != 0 || s.Delayed != 0 {
		t.Fatalf("early ExpireLease changed state: %+v", s)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], expireAt(1100)) })
	if s := stats(t, db, "t", "g", 1100); s != (Stats{InFlight: 1, Delayed: 1}) {
		t.Fatalf("stats after expiry = %+v, want in_flight 1, delayed 1", s)
	}
	if s := stats(t, db, "t", "g", 2100); s != (Stats{InFlight: 1, Backlog: 1}) {
		t.Fatalf("stats once the backoff passed = %+v, want backlog 1", s)
	}
	// A second expiry of the same delivery is a no-op.
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], expireAt(1200)) })
	if ds := lease(t, db, "t", "g", 2099, 100, 10, 8); len(ds) != 0 {
		t.Fatalf("redelivered before the backoff (1000 ms) passed: %+v", ds)
	}
	ds := lease(t, db, "t", "g", 2100, 100, 10, 9)
	if len(ds) != 1 || ds[0].Partition != 0 || ds[0].Offset != 0 || ds[0].RetryCount != 1 || ds[0].Delivery != 9 ||
		ds[0].Reason != "lease expired" {
		t.Fatalf("redelivery = %+v, want 0/0 retry 1 delivery 9, reason lease expired", ds)
	}
	// The old receipt is stale; the new one works.
	st := ack(t, db, "t", "g", 2101, 10, rs[0], receiptsOf(ds)[0])
	if !reflect.DeepEqual(st, []string{StatusStale, StatusOK}) {
		t.Fatalf("acks = %v, want [stale ok]", st)
	}
	// Each further failure doubles the backoff.
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[1], expireAt(1300)) }) // due 2300
	ds = lease(t, db, "t", "g", 2300, 100, 10, 11)
	if len(ds) != 1 || ds[0].Offset != 1 || ds[0].RetryCount != 1 {
		t.Fatalf("redelivery of 0/1 = %+v", ds)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(receiptsOf(ds)[0], expireAt(2400)) }) // due 4400
	if ds := lease(t, db, "t", "g", 4399, 100, 10, 12); len(ds) != 0 {
		t.Fatalf("second retry before 2000 ms: %+v", ds)
	}
	ds = lease(t, db, "t", "g", 4400, 100, 10, 13)
	if len(ds) != 1 || ds[0].RetryCount != 2 {
		t.Fatalf("second redelivery = %+v, want retry 2", ds)
	}
}

func TestExpireLeaseJitter(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 1, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5))
	f := expireAt(1100)
	f.Rand = 1 << 31 // half of the jitter range: +500 ms
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], f) })
	if s := stats(t, db, "t", "g", 2599); s.Delayed != 1 {
		t.Fatalf("due before 1100+1000+500: %+v", s)
	}
	if s := stats(t, db, "t", "g", 2600); s.Backlog != 1 {
		t.Fatalf("not due at 1100+1000+500: %+v", s)
	}
}

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		base, max, jitter int64
		retry, rand       uint32
		want              int64
	}{
		{1000, 600000, 1000, 1, 0, 1000},
		{1000, 600000, 1000, 2, 0, 2000},
		{1000, 600000, 1000, 3, 0, 4000},
		{1000, 600000, 0, 10, 0, 512000},
		{1000, 600000, 0, 11, 0, 600000},
		{1000, 600000, 0, 1000, 0, 600000},
		{1000, 600000, 1000, 1, 1 << 31, 1500},
		{1000, 600000, 1000, 1, 1<<32 - 1, 2000},
		{0, 600000, 0, 5, 1<<32 - 1, 0},
		{50, 0, 0, 3, 0, 0},
	} {
		if got := Backoff(c.base, c.max, c.jitter, c.retry, c.rand); got != c.want {
			t.Errorf("Backoff(%d, %d, %d, retry %d, rand %d) = %d, want %d", c.base, c.max, c.jitter, c.retry, c.rand, got, c.want)
		}
	}
}

func TestExpireLeaseOutOfRetriesGoesToDLQ(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPatchTopic(t, db, "t", mlog.Patch{MaxRetry: ptr(int64(1)), BackoffJitterMs: ptr(int64(0))})
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 1, 5))
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], expireAt(1100)) })
	ds := lease(t, db, "t", "g", 2100, 100, 1, 6)
	if len(ds) != 1 || ds[0].Offset != 0 || ds[0].RetryCount != 1 {
		t.Fatalf("retry = %+v", ds)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(receiptsOf(ds)[0], expireAt(2200)) })
	if s := stats(t, db, "t", "g", 1<<40); s != (Stats{Backlog: 1, DLQ: 1}) {
		t.Fatalf("stats after the last retry failed = %+v, want dlq 1 and only 0/1 in the backlog", s)
	}
	ds = lease(t, db, "t", "g", 1<<40, 100, 10, 7)
	if len(ds) != 1 || ds[0].Offset != 1 {
		t.Fatalf("lease after dead-lettering 0/0 = %+v, want only 0/1", ds)
	}
}

func TestNackNotRetryableGoesToDLQ(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 1, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 1, 5))
	var st []string
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = g.Nack(1001, 6, rs, []Failure{{Failure: dlq.Failure{At: 1001, Kind: dlq.KindRejected, Reason: "poison"}, DelayMs: -1}})
		return err
	})
	if !reflect.DeepEqual(st, []string{StatusOK}) {
		t.Fatalf("nack = %v", st)
	}
	if s := stats(t, db, "t", "g", 1<<40); s != (Stats{DLQ: 1}) {
		t.Fatalf("stats after a non-retryable nack = %+v, want dlq 1", s)
	}
}

func TestExpireLeaseIgnoresAcked(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 1, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5))
	ack(t, db, "t", "g", 1001, 6, rs...)
	withGroup(t, db, "t", "g", func(g *Group) error { return g.ExpireLease(rs[0], expireAt(5000)) })
	if s := stats(t, db, "t", "g", 1<<40); s != (Stats{Acked: 1}) {
		t.Fatalf("ExpireLease of an acked message changed state: %+v", s)
	}
	if ds := lease(t, db, "t", "g", 1<<40, 100, 10, 7); len(ds) != 0 {
		t.Fatalf("acked message redelivered: %+v", ds)
	}
}

func TestNackRetryable(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 2, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 5))
	var st []string
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = nack(g, 1010, 6, 990, rs[:1]...) // due at 2000
		return err
	})
	if !reflect.DeepEqual(st, []string{StatusOK}) {
		t.Fatalf("nack = %v", st)
	}
	if s := stats(t, db, "t", "g", 1050); s != (Stats{InFlight: 1, Delayed: 1}) {
		t.Fatalf("stats while the nacked message waits = %+v", s)
	}
	if ds := lease(t, db, "t", "g", 1999, 100, 10, 7); len(ds) != 0 {
		t.Fatalf("nacked message delivered before its due time: %+v", ds)
	}
	if s := stats(t, db, "t", "g", 2000); s.Backlog != 1 || s.Delayed != 0 {
		t.Fatalf("stats once due = %+v", s)
	}
	ds := lease(t, db, "t", "g", 2000, 100, 10, 8)
	if len(ds) != 1 || ds[0].Offset != 0 || ds[0].RetryCount != 1 || ds[0].Reason != "test" {
		t.Fatalf("redelivery after nack = %+v", ds)
	}
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = nack(g, 2001, 9, 0, rs[:1]...) // the old delivery
		return err
	})
	if !reflect.DeepEqual(st, []string{StatusStale}) {
		t.Fatalf("nack of a replaced delivery = %v", st)
	}
	// Without delay_ms the topic's backoff applies (1000 ms for retry 2... doubled: 2000).
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		st, err = nack(g, 2002, 10, -1, receiptsOf(ds)...)
		return err
	})
	if s := stats(t, db, "t", "g", 4001); s.Delayed != 1 {
		t.Fatalf("second nack due before 2002+2000: %+v", s)
	}
	if s := stats(t, db, "t", "g", 4002); s.Delayed != 0 || s.Backlog != 1 {
		t.Fatalf("second nack not due at 2002+2000: %+v", s)
	}
}

func TestDueLeasesAcrossTopicsAndGroups(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "a", 2)
	mustTopic(t, db, "b", 1)
	mustPublish(t, db, "a", 0, 1, 1)
	mustPublish(t, db, "a", 1, 1, 1)
	mustPublish(t, db, "b", 0, 1, 1)
	lease(t, db, "a", "g1", 1000, 300, 1, 10) // a/g1 0/0 until 1300
	lease(t, db, "b", "g2", 1000, 100, 1, 11) // b/g2 0/0 until 1100
	lease(t, db, "a", "g2", 1000, 200, 2, 12) // a/g2 0/0, 1/0 until 1200
	if due := dueLeases(t, db, 1099, 10); len(due) != 0 {
		t.Fatalf("DueLeases before any expiry = %+v", due)
	}
	want := []Expired{
		{Topic: "b", Group: "g2", Receipt: Receipt{0, 0, 11}},
		{Topic: "a", Group: "g2", Receipt: Receipt{0, 0, 12}},
		{Topic: "a", Group: "g2", Receipt: Receipt{1, 0, 12}},
		{Topic: "a", Group: "g1", Receipt: Receipt{0, 0, 10}},
	}
	if got := dueLeases(t, db, 1300, 10); !reflect.DeepEqual(got, want) {
		t.Fatalf("DueLeases(1300) =\n%+v\nwant\n%+v", got, want)
	}
	if got := dueLeases(t, db, 1250, 10); !reflect.DeepEqual(got, want[:3]) {
		t.Fatalf("DueLeases(1250) = %+v", got)
	}
	if got := dueLeases(t, db, 5000, 2); !reflect.DeepEqual(got, want[:2]) {
		t.Fatalf("DueLeases with limit 2 = %+v", got)
	}
	// Expiring them all empties the index.
	for _, e := range dueLeases(t, db, 5000, 10) {
		withGroup(t, db, e.Topic, e.Group, func(g *Group) error { return g.ExpireLease(e.Receipt, expireAt(5000)) })
	}
	if got := dueLeases(t, db, 1<<40, 10); len(got) != 0 {
		t.Fatalf("DueLeases after expiring all = %+v", got)
	}
}

func TestFloor(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	mustPublish(t, db, "t", 0, 5, 1)
	floor := func(p uint32) uint64 {
		var f uint64
		withGroup(t, db, "t", "g", func(g *Group) error {
			var err error
			f, err = g.Floor(p)
			return err
		})
		return f
	}
	if f := floor(0); f != 0 {
		t.Fatalf("Floor of an untouched partition = %d, want 0", f)
	}
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 3, 4)) // 0,1,2 leased
	if f := floor(0); f != 0 {
		t.Fatalf("Floor with 0 leased = %d, want 0", f)
	}
	ack(t, db, "t", "g", 1001, 5, rs[0], rs[2])
	if f := floor(0); f != 1 {
		t.Fatalf("Floor with 1 leased = %d, want 1", f)
	}
	ack(t, db, "t", "g", 1002, 6, rs[1])
	if f := floor(0); f != 3 {
		t.Fatalf("Floor with all acked = %d, want the cursor 3", f)
	}
	if f := floor(1); f != 0 {
		t.Fatalf("Floor of empty partition 1 = %d, want 0", f)
	}
	mustPublish(t, db, "t", 1, 2, 1)
	lease(t, db, "t", "g", 1003, 100, 10, 7) // 3,4 of p0 and 0,1 of p1
	if f := floor(1); f != 0 {
		t.Fatalf("Floor(1) = %d, want 0", f)
	}
}

func TestOnTrimDropsRecords(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	mustPublish(t, db, "t", 0, 4, 1)
	mustPublish(t, db, "t", 1, 1, 1)
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 4)) // all 5 leased
	// Make 0/1 ready (released), the rest stay leased.
	var r01 Receipt
	for _, r := range rs {
		if r.Partition == 0 && r.Offset == 1 {
			r01 = r
		}
	}
	withGroup(t, db, "t", "g", func(g *Group) error {
		_, err := nack(g, 1001, 5, 7999, r01)
		return err
	})
	// The log drops offsets 0..2 of partition 0.
	if err := db.Update(func(tx *bolt.Tx) error {
		p, _ := mlog.OpenPartition(tx, "t", 0)
		_, err := p.TrimTo(3)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	withGroup(t, db, "t", "g", func(g *Group) error { return g.OnTrim(mlog.Trimmed{Partition: 0, NewFirst: 3}) })
	if s := stats(t, db, "t", "g", 1002); s != (Stats{InFlight: 2}) {
		t.Fatalf("stats after trim = %+v, want in_flight 2 (0/3 and 1/0)", s)
	}
	due := dueLeases(t, db, 1<<40, 100)
	var left []po
	for _, e := range due {
		left = append(left, po{e.Partition, e.Offset})
	}
	sort.Slice(left, func(i, j int) bool {
		return left[i].p < left[j].p || left[i].p == left[j].p && left[i].off < left[j].off
	})
	if !reflect.DeepEqual(left, []po{{0, 3}, {1, 0}}) {
		t.Fatalf("leases left in the expiry index = %v", left)
	}
	var floor uint64
	withGroup(t, db, "t", "g", func(g *Group) error {
		var err error
		floor, err = g.Floor(0)
		return err
	})
	if floor != 3 {
		t.Fatalf("Floor after trim = %d, want 3", floor)
	}
	// Receipts of trimmed messages are stale now.
	st := ack(t, db, "t", "g", 1003, 6, rs...)
	for i, r := range rs {
		want := StatusStale
		if (r.Partition == 0 && r.Offset == 3) || r.Partition == 1 {
			want = StatusOK
		}
		if st[i] != want {
			t.Errorf("ack of %d/%d after trim = %q, want %q", r.Partition, r.Offset, st[i], want)
		}
	}
}

func TestStatsFigures(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	mustPublish(t, db, "t", 0, 6, 1)
	mustPublish(t, db, "t", 1, 4, 1)
	ds := lease(t, db, "t", "g", 1000, 100, 5, 2) // p0 0,1,2 and p1 0,1
	rs := receiptsOf(ds)
	ack(t, db, "t", "g", 1001, 3, rs[0], rs[1])
	withGroup(t, db, "t", "g", func(g *Group) error {
		if _, err := nack(g, 1002, 4, 498, rs[2]); err != nil { // due at 1500
			return err
		}
		_, err := nack(g, 1002, 4, 0, rs[3]) // due at once
		return err
	})
	want := Stats{Backlog: 5 + 1, InFlight: 1, Delayed: 1, Acked: 2}
	if got := stats(t, db, "t", "g", 1100); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
	want = Stats{Backlog: 5 + 2, InFlight: 1, Delayed: 0, Acked: 2}
	if got := stats(t, db, "t", "g", 1500); got != want {
		t.Fatalf("stats at 1500 = %+v, want %+v", got, want)
	}
}

func TestOpenAndNames(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	err := db.Update(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, "t")
		if _, err := Open(tx, l, "g", false, 0); !errors.Is(err, ErrGroupNotFound) {
			t.Errorf("Open missing group: err = %v", err)
		}
		for _, bad := range []string{"", ".", "..", "a/b"} {
			if _, err := Open(tx, l, bad, true, 0); !errors.Is(err, mlog.ErrInvalidName) {
				t.Errorf("Open(%q, create): err = %v", bad, err)
			}
		}
		for _, n := range []string{"b", "a"} {
			if _, err := Open(tx, l, n, true, 77); err != nil {
				return err
			}
		}
		if got := Names(l); !reflect.DeepEqual(got, []string{"a", "b"}) {
			t.Errorf("Names = %v", got)
		}
		g, err := Open(tx, l, "a", false, 0)
		if err != nil || g.c.Created != 77 {
			t.Errorf("reopen: %v, created %d", err, g.c.Created)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDeleteGroupDropsLeases(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 3, 1)
	lease(t, db, "t", "gone", 1000, 100, 3, 4)
	lease(t, db, "t", "kept", 1000, 200, 1, 5)
	if err := db.Update(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, "t")
		return Delete(tx, l, "gone")
	}); err != nil {
		t.Fatal(err)
	}
	due := dueLeases(t, db, 1<<40, 10)
	if len(due) != 1 || due[0].Group != "kept" {
		t.Fatalf("DueLeases after group delete = %+v", due)
	}
	err := db.Update(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, "t")
		return Delete(tx, l, "gone")
	})
	if !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("second delete: err = %v", err)
	}
	// A re-created group starts at the head again.
	if ds := lease(t, db, "t", "gone", 2000, 100, 10, 6); len(ds) != 3 {
		t.Fatalf("re-created group leased %d, want 3", len(ds))
	}
}

func TestDropTopicLeases(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "a", 1)
	mustTopic(t, db, "b", 1)
	mustPublish(t, db, "a", 0, 2, 1)
	mustPublish(t, db, "b", 0, 1, 1)
	lease(t, db, "a", "g1", 1000, 100, 10, 3)
	lease(t, db, "a", "g2", 1000, 100, 10, 4)
	lease(t, db, "b", "g1", 1000, 100, 10, 5)
	if err := db.Update(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, "a")
		if err := DropTopicLeases(tx, l); err != nil {
			return err
		}
		return mlog.DeleteTopic(tx, "a")
	}); err != nil {
		t.Fatal(err)
	}
	due := dueLeases(t, db, 1<<40, 10)
	if len(due) != 1 || due[0].Topic != "b" {
		t.Fatalf("DueLeases after topic delete = %+v", due)
	}
}

func TestNeedsLease(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 2)
	deliverable := func(name string, now int64) bool {
		var ok bool
		if err := db.View(func(tx *bolt.Tx) error {
			var err error
			ok, err = NeedsLease(tx, "t", name, now)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !deliverable("g", 1000) {
		t.Fatalf("missing group over an empty topic needs no lease command: a first fetch would not create it")
	}
	if got := lease(t, db, "t", "g", 1000, 100, 10, 3); len(got) != 0 {
		t.Fatalf("lease on an empty topic = %v", got)
	}
	if deliverable("g", 1000) {
		t.Fatalf("existing group over an empty topic needs a lease command (a Raft round per empty poll)")
	}
	mustPublish(t, db, "t", 1, 1, 1)
	if !deliverable("g2", 1000) {
		t.Fatalf("missing group over a non-empty topic needs no lease command")
	}
	if !deliverable("g", 1000) {
		t.Fatalf("existing group with a new message needs no lease command")
	}
	rs := receiptsOf(lease(t, db, "t", "g", 1000, 100, 10, 3))
	if deliverable("g", 1001) {
		t.Fatalf("deliverable while the only message is leased")
	}
	withGroup(t, db, "t", "g", func(g *Group) error {
		_, err := nack(g, 1002, 4, 498, rs...)
		return err
	})
	if deliverable("g", 1499) {
		t.Fatalf("deliverable before the retry is due")
	}
	if !deliverable("g", 1500) {
		t.Fatalf("not deliverable once the retry is due")
	}
	err := db.View(func(tx *bolt.Tx) error {
		_, err := NeedsLease(tx, "nope", "g", 0)
		return err
	})
	if !errors.Is(err, mlog.ErrTopicNotFound) {
		t.Fatalf("NeedsLease(unknown topic): err = %v", err)
	}
}

func TestDelayedMessageDoesNotBlockHead(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	if err := db.Update(func(tx *bolt.Tx) error {
		part, _ := mlog.OpenPartition(tx, "t", 0)
		for _, at := range []int64{0, 5000, 0} {
			if _, err := part.Append(&mlog.Message{PublishedAt: 1, DeliverAt: at, Value: []byte("x")}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ds := lease(t, db, "t", "g", 1000, 100, 10, 3)
	if got := placements(ds); !reflect.DeepEqual(got, []po{{0, 0}, {0, 2}}) {
		t.Fatalf("lease with a delayed message = %v, want [{0 0} {0 2}]", got)
	}
	if s := stats(t, db, "t", "g", 1000); s.Delayed != 1 || s.InFlight != 2 || s.Backlog != 0 {
		t.Fatalf("stats with one delayed = %+v", s)
	}
	ds = lease(t, db, "t", "g", 5000, 100, 10, 4)
	if len(ds) != 1 || ds[0].Offset != 1 || ds[0].RetryCount != 0 {
		t.Fatalf("delayed message once due = %+v, want 0/1 retry 0", ds)
	}
}

// Record and counter codecs are internal, but a corrupt record must be an
// error, never a panic.
func TestRecordCodec(t *testing.T) {
	r := record{State: stateLeased, RetryCount: 3, Delivery: 1 << 40, Until: -5, Key: "k", Reason: "why",
		History: []dlq.Failure{{At: 7, Kind: dlq.KindNack, Reason: "r1", Node: "n1"}, {At: 9, Kind: dlq.KindLeaseExpired}}}
	got, err := decodeRecord(r.encode())
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("record round trip = %+v, %v", got, err)
	}
	b := r.encode()
	for n := 0; n < len(b); n++ {
		if _, err := decodeRecord(b[:n]); !errors.Is(err, mlog.ErrCorrupt) {
			t.Fatalf("record prefix %d: err = %v", n, err)
		}
	}
	c := counters{Acked: 1, DupSkipped: 2, InFlight: 3, Ready: 4, Held: 6, Created: 5}
	gc, err := decodeCounters(c.encode())
	if err != nil || gc != c {
		t.Fatalf("counters round trip = %+v, %v", gc, err)
	}
	k := expiryKey(1234, 5, 6, "topic", "grp")
	if binary.BigEndian.Uint64(k) != 1234 || string(k[20:]) != "topic\x00grp" {
		t.Fatalf("expiry key = %x", k)
	}
}

// A lease bounded in bytes stops once its messages' records reach the
// bound, leasing the first whatever its size, and the next lease goes on
// from where it stopped (nothing passed over is lost): first new
// messages, then a redelivery.
func TestLeaseBytes(t *testing.T) {
	db := mustDB(t)
	mustTopic(t, db, "t", 1)
	mustPublish(t, db, "t", 0, 10, 1)
	leaseBounded := func(bound int, now int64, idx uint64) []Delivery {
		var ds []Delivery
		withGroup(t, db, "t", "g", func(g *Group) error {
			g.LimitLeaseBytes(bound)
			var err error
			ds, err = g.Lease(now, 30000, 10, idx, false)
			return err
		})
		return ds
	}
	var got []uint64
	for i := range 3 {
		ds := leaseBounded(1, 10, uint64(10+i))
		if len(ds) != 1 {
			t.Fatalf("lease %d bounded to 1 byte: %d deliveries, want 1", i, len(ds))
		}
		got = append(got, ds[0].Offset)
	}
	if !slices.Equal(got, []uint64{0, 1, 2}) {
		t.Fatalf("bounded leases took offsets %v, want 0, 1, 2", got)
	}
	// Unbounded (as before format 2): the other 7 at once.
	if ds := leaseBounded(0, 10, 20); len(ds) != 7 {
		t.Fatalf("unbounded lease: %d deliveries, want 7", len(ds))
	}
	// A nacked message comes back alone under the bound.
	var first Delivery
	withGroup(t, db, "t", "g", func(g *Group) error {
		st, err := nack(g, 11, 21, 0, Receipt{Partition: 0, Offset: 0, Delivery: 10})
		if err == nil && st[0] != StatusOK {
			t.Fatalf("nack: %v", st)
		}
		return err
	})
	ds := leaseBounded(1, 12, 22)
	if len(ds) != 1 {
		t.Fatalf("bounded lease of a redelivery: %d deliveries, want 1", len(ds))
	}
	first = ds[0]
	if first.Offset != 0 || first.RetryCount != 1 {
		t.Fatalf("bounded lease of a redelivery: %+v, want offset 0 with retry 1", first)
	}
}
