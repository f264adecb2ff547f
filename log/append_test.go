package log

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// mustAppend appends one message per value to partition p, published at
// at[i], and returns their offsets.
func mustAppend(t testing.TB, db *bolt.DB, topic string, p uint32, at []int64, values ...string) []uint64 {
	t.Helper()
	var offs []uint64
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		part, err := OpenPartition(tx, topic, p)
		if err != nil {
			return err
		}
		for i, v := range values {
			off, err := part.Append(&Message{PublishedAt: at[i], MaxRetry: -1, Value: []byte(v)})
			if err != nil {
				return err
			}
			offs = append(offs, off)
		}
		return nil
	})
	return offs
}

func mustParts(t testing.TB, db *bolt.DB, topic string) []PartitionMeta {
	t.Helper()
	var out []PartitionMeta
	if err := db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = Partitions(tx, topic)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// values reads every retained message of partition p.
func values(t testing.TB, db *bolt.DB, topic string, p uint32) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	_ = db.View(func(tx *bolt.Tx) error {
		part, err := OpenPartition(tx, topic, p)
		if err != nil {
			t.Fatal(err)
		}
		for off := part.Meta.First; off < part.Meta.Next; off++ {
			m, err := part.Get(off)
			if err != nil || m == nil {
				t.Fatalf("Get(%d) = %v, %v inside [first, next)", off, m, err)
			}
			out[off] = string(m.Value)
		}
		return nil
	})
	return out
}

func TestAppendGetOffsets(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(2))})
	offs := mustAppend(t, db, "t", 0, []int64{10, 20, 30}, "a", "bb", "ccc")
	if !reflect.DeepEqual(offs, []uint64{0, 1, 2}) {
		t.Fatalf("offsets = %v, want [0 1 2]", offs)
	}
	if offs := mustAppend(t, db, "t", 0, []int64{40}, "dddd"); offs[0] != 3 {
		t.Fatalf("offset in a later transaction = %d, want 3", offs[0])
	}
	if offs := mustAppend(t, db, "t", 1, []int64{5}, "x"); offs[0] != 0 {
		t.Fatalf("partition 1 first offset = %d, want 0 (offsets are per partition)", offs[0])
	}
	parts := mustParts(t, db, "t")
	if parts[0] != (PartitionMeta{First: 0, Next: 4, Bytes: 10}) || parts[1] != (PartitionMeta{First: 0, Next: 1, Bytes: 1}) {
		t.Fatalf("metas = %+v", parts)
	}
	_ = db.View(func(tx *bolt.Tx) error {
		part, err := OpenPartition(tx, "t", 0)
		if err != nil {
			t.Fatal(err)
		}
		m, err := part.Get(2)
		if err != nil || m == nil {
			t.Fatalf("Get(2) = %v, %v", m, err)
		}
		if m.Offset != 2 || string(m.Value) != "ccc" || m.PublishedAt != 30 || m.MaxRetry != -1 {
			t.Fatalf("Get(2) = %+v", m)
		}
		if m, err := part.Get(4); m != nil || err != nil {
			t.Fatalf("Get(next) = %v, %v; want nil, nil", m, err)
		}
		if ht, ok, err := part.HeadTime(); ht != 10 || !ok || err != nil {
			t.Fatalf("HeadTime = %d, %v, %v", ht, ok, err)
		}
		p1, _ := OpenPartition(tx, "t", 1)
		if _, err := OpenPartition(tx, "t", 2); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenPartition(2 of 2): err = %v", err)
		}
		if _, err := OpenPartition(tx, "nope", 0); !errors.Is(err, ErrTopicNotFound) {
			t.Fatalf("OpenPartition(unknown topic): err = %v", err)
		}
		if ht, ok, _ := p1.HeadTime(); ht != 5 || !ok {
			t.Fatalf("p1 HeadTime = %d, %v", ht, ok)
		}
		l, err := Open(tx, "t")
		if err != nil {
			t.Fatal(err)
		}
		count, size, err := l.Totals()
		if count != 5 || size != 11 || err != nil {
			t.Fatalf("Totals = %d, %d, %v; want 5, 11", count, size, err)
		}
		if _, err := l.Partition(2); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Log.Partition(2 of 2): err = %v", err)
		}
		return nil
	})
}

func TestAppendedMessageKeepsFields(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	in := sampleMessage()
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		part, err := OpenPartition(tx, "t", 0)
		if err != nil {
			return err
		}
		_, err = part.Append(in)
		return err
	})
	var got *Message
	_ = db.View(func(tx *bolt.Tx) error {
		part, _ := OpenPartition(tx, "t", 0)
		m, err := part.Get(0)
		if err != nil {
			t.Fatal(err)
		}
		got = m.Clone() // outlives the transaction
		return nil
	})
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("stored message:\n got %+v\nwant %+v", got, in)
	}
}

func TestEmptyPartitionHeadTime(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	_ = db.View(func(tx *bolt.Tx) error {
		part, _ := OpenPartition(tx, "t", 0)
		if _, ok, err := part.HeadTime(); ok || err != nil {
			t.Fatalf("empty HeadTime: ok = %v, err = %v", ok, err)
		}
		return nil
	})
}

func TestCheckSize(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{MaxMessageBytes: ptr(int64(4))})
	_ = db.View(func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		if err := l.CheckSize(4); err != nil {
			t.Errorf("CheckSize(4) = %v", err)
		}
		if err := l.CheckSize(5); !errors.Is(err, ErrTooLarge) {
			t.Errorf("CheckSize(5) = %v, want ErrTooLarge", err)
		}
		return nil
	})
}

func TestTrimTo(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	mustAppend(t, db, "t", 0, []int64{1, 2, 3, 4}, "a", "bb", "ccc", "dddd")
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		part, _ := OpenPartition(tx, "t", 0)
		if n, err := part.TrimTo(0); n != 0 || err != nil {
			t.Errorf("TrimTo(0) = %d, %v", n, err)
		}
		if n, err := part.TrimTo(2); n != 2 || err != nil {
			t.Errorf("TrimTo(2) = %d, %v", n, err)
		}
		if n, err := part.TrimTo(1); n != 0 || err != nil {
			t.Errorf("TrimTo(1) after TrimTo(2) = %d, %v", n, err)
		}
		if m, _ := part.Get(1); m != nil {
			t.Errorf("Get(1) after trim = %+v", m)
		}
		return nil
	})
	if got := mustParts(t, db, "t")[0]; got != (PartitionMeta{First: 2, Next: 4, Bytes: 7}) {
		t.Fatalf("meta after TrimTo(2) = %+v", got)
	}
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		part, _ := OpenPartition(tx, "t", 0)
		if n, err := part.TrimTo(100); n != 2 || err != nil { // clamps at Next
			t.Errorf("TrimTo(100) = %d, %v", n, err)
		}
		return nil
	})
	if got := mustParts(t, db, "t")[0]; got != (PartitionMeta{First: 4, Next: 4, Bytes: 0}) {
		t.Fatalf("meta after TrimTo(100) = %+v", got)
	}
	// Offsets keep growing after the partition emptied.
	if offs := mustAppend(t, db, "t", 0, []int64{5}, "e"); offs[0] != 4 {
		t.Fatalf("offset after full trim = %d, want 4", offs[0])
	}
}

func TestMakeRoomUnlimited(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	mustAppend(t, db, "t", 0, []int64{1, 2}, "a", "b")
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		tr, err := l.MakeRoom(1000000, 1<<40)
		if tr != nil || err != nil {
			t.Errorf("MakeRoom without limits = %v, %v", tr, err)
		}
		return nil
	})
}

func TestMakeRoomRejectPublish(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch Patch
		n, sz uint64
		fits  bool
	}{
		{"messages fit exactly", Patch{MaxMessages: ptr(int64(4))}, 1, 1, true},
		{"one message too many", Patch{MaxMessages: ptr(int64(4))}, 2, 2, false},
		{"bytes fit exactly", Patch{MaxBytes: ptr(int64(10))}, 1, 4, true},
		{"one byte too many", Patch{MaxBytes: ptr(int64(10))}, 1, 5, false},
		{"batch alone exceeds", Patch{MaxMessages: ptr(int64(100))}, 101, 101, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := mustDB(t)
			mustPutTopic(t, db, "t", tc.patch)
			mustAppend(t, db, "t", 0, []int64{1, 2, 3}, "ab", "cd", "ef")
			before := mustParts(t, db, "t")
			mustUpdate(t, db, func(tx *bolt.Tx) error {
				l, _ := Open(tx, "t")
				tr, err := l.MakeRoom(tc.n, tc.sz)
				if tc.fits && (err != nil || tr != nil) {
					t.Errorf("MakeRoom(%d, %d) = %v, %v; want room", tc.n, tc.sz, tr, err)
				}
				if !tc.fits && (!errors.Is(err, ErrTopicFull) || tr != nil) {
					t.Errorf("MakeRoom(%d, %d) = %v, %v; want ErrTopicFull", tc.n, tc.sz, tr, err)
				}
				return nil
			})
			if after := mustParts(t, db, "t"); !reflect.DeepEqual(after, before) {
				t.Fatalf("reject-publish changed the log: %+v -> %+v", before, after)
			}
		})
	}
}

func TestMakeRoomDropHead(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(2)), MaxMessages: ptr(int64(5)), Overflow: ptr(OverflowDropHead)})
	// Interleaved publish times: the oldest heads are p0@10, p1@15, p0@20, ...
	mustAppend(t, db, "t", 0, []int64{10, 20, 40}, "p0a", "p0b", "p0c")
	mustAppend(t, db, "t", 1, []int64{15, 30}, "p1a", "p1b")
	var tr []Trimmed
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		var err error
		if tr, err = l.MakeRoom(3, 3); err != nil {
			return err
		}
		// The Log's partitions reflect the trim within the transaction.
		count, _, _ := l.Totals()
		if count != 2 {
			t.Errorf("count after MakeRoom = %d, want 2", count)
		}
		return nil
	})
	want := []Trimmed{{Partition: 0, NewFirst: 2}, {Partition: 1, NewFirst: 1}}
	if !reflect.DeepEqual(tr, want) {
		t.Fatalf("trimmed = %+v, want %+v", tr, want)
	}
	parts := mustParts(t, db, "t")
	if parts[0] != (PartitionMeta{First: 2, Next: 3, Bytes: 3}) || parts[1] != (PartitionMeta{First: 1, Next: 2, Bytes: 3}) {
		t.Fatalf("metas after drop-head = %+v", parts)
	}
	if got := values(t, db, "t", 0); !reflect.DeepEqual(got, map[uint64]string{2: "p0c"}) {
		t.Fatalf("p0 retained %v", got)
	}
	if got := values(t, db, "t", 1); !reflect.DeepEqual(got, map[uint64]string{1: "p1b"}) {
		t.Fatalf("p1 retained %v", got)
	}
}

func TestMakeRoomDropHeadBytes(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{MaxBytes: ptr(int64(10)), Overflow: ptr(OverflowDropHead)})
	mustAppend(t, db, "t", 0, []int64{1, 2, 3}, "aaaa", "bbbb", "cc") // 10 bytes
	var tr []Trimmed
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		var err error
		tr, err = l.MakeRoom(1, 5) // needs 5 bytes: drop both 4-byte heads
		return err
	})
	if !reflect.DeepEqual(tr, []Trimmed{{Partition: 0, NewFirst: 2}}) {
		t.Fatalf("trimmed = %+v", tr)
	}
	if got := mustParts(t, db, "t")[0]; got != (PartitionMeta{First: 2, Next: 3, Bytes: 2}) {
		t.Fatalf("meta = %+v", got)
	}
	// A single batch larger than the limit is refused even under drop-head,
	// and nothing is dropped for it.
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		if _, err := l.MakeRoom(1, 11); !errors.Is(err, ErrTopicFull) {
			t.Errorf("oversized batch: err = %v, want ErrTopicFull", err)
		}
		return nil
	})
	if got := mustParts(t, db, "t")[0]; got != (PartitionMeta{First: 2, Next: 3, Bytes: 2}) {
		t.Fatalf("meta after refused batch = %+v", got)
	}
}

func TestTrimOlderThanPlan(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{Partitions: ptr(uint32(3))})
	mustAppend(t, db, "t", 0, []int64{100, 200, 300}, "a", "b", "c")
	mustAppend(t, db, "t", 1, []int64{250, 260}, "d", "e")
	// partition 2 stays empty
	before := mustParts(t, db, "t")
	for _, tc := range []struct {
		cutoff int64
		want   []Trimmed
	}{
		{0, nil},
		{100, nil}, // published exactly at the cutoff is kept
		{101, []Trimmed{{0, 1}}},
		{255, []Trimmed{{0, 2}, {1, 1}}},
		{1000, []Trimmed{{0, 3}, {1, 2}}},
	} {
		_ = db.View(func(tx *bolt.Tx) error {
			l, _ := Open(tx, "t")
			got, err := l.TrimOlderThanPlan(tc.cutoff)
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("TrimOlderThanPlan(%d) = %+v, %v; want %+v", tc.cutoff, got, err, tc.want)
			}
			return nil
		})
	}
	if after := mustParts(t, db, "t"); !reflect.DeepEqual(after, before) {
		t.Fatalf("the plan wrote: %+v -> %+v", before, after)
	}
	// After a real trim, the plan starts from the new head.
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		p, _ := OpenPartition(tx, "t", 0)
		_, err := p.TrimTo(1)
		return err
	})
	_ = db.View(func(tx *bolt.Tx) error {
		l, _ := Open(tx, "t")
		got, _ := l.TrimOlderThanPlan(101)
		if got != nil {
			t.Errorf("plan after trim = %+v, want nothing", got)
		}
		return nil
	})
}

func BenchmarkAppend(b *testing.B) {
	db := mustDB(b)
	mustPutTopic(b, db, "t", Patch{})
	val := make([]byte, 256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := db.Update(func(tx *bolt.Tx) error {
			p, err := OpenPartition(tx, "t", 0)
			if err != nil {
				return err
			}
			_, err = p.Append(&Message{PublishedAt: int64(i), Value: val})
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestPartitionHead(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		p, _ := OpenPartition(tx, "t", 0)
		if _, err := p.Append(&Message{PublishedAt: 5, DeliverAt: 900, IdempotencyKey: "k", Value: []byte("v")}); err != nil {
			return err
		}
		_, err := p.Append(&Message{PublishedAt: 6})
		return err
	})
	_ = db.View(func(tx *bolt.Tx) error {
		p, _ := OpenPartition(tx, "t", 0)
		if at, key, ok, err := p.Head(0); at != 900 || key != "k" || !ok || err != nil {
			t.Errorf("Head(0) = %d, %q, %v, %v", at, key, ok, err)
		}
		if at, key, ok, err := p.Head(1); at != 0 || key != "" || !ok || err != nil {
			t.Errorf("Head(1) = %d, %q, %v, %v", at, key, ok, err)
		}
		if _, _, ok, err := p.Head(2); ok || err != nil {
			t.Errorf("Head(next) ok = %v, err = %v; want not retained", ok, err)
		}
		return nil
	})
}

// BenchmarkTrimTo appends b.N messages of 1 KiB in transactions of 100 and
// then trims them 100 per transaction, the way consumed messages leave a
// work-queue topic. Only the trimming is timed.
func BenchmarkTrimTo(b *testing.B) {
	db := mustDB(b)
	mustPutTopic(b, db, "t", Patch{})
	val := strings.Repeat("v", 1024)
	vals := make([]string, 100)
	at := make([]int64, 100)
	for i := range vals {
		vals[i], at[i] = val, 1
	}
	for done := 0; done < b.N; done += 100 {
		mustAppend(b, db, "t", 0, at, vals...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for off := uint64(0); off < uint64(b.N); off += 100 {
		mustUpdate(b, db, func(tx *bolt.Tx) error {
			part, err := OpenPartition(tx, "t", 0)
			if err != nil {
				return err
			}
			_, err = part.TrimTo(off + 100)
			return err
		})
	}
}

// Messages are appended at increasing offsets: their leaves must split
// full, not half full (bbolt's default), or the file holds about twice the
// payload. 8 MiB of 1 KiB messages, 64 per transaction (a group-commit
// batch): 2.02 bytes of pages per payload byte half full; full, three
// messages share a 4 KiB page (1.33× is the floor at this size).
func TestAppendFillsPages(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{})
	val := make([]byte, 1024)
	const total, perTx = 8192, 64
	for i := 0; i < total; i += perTx {
		mustUpdate(t, db, func(tx *bolt.Tx) error {
			p, err := OpenPartition(tx, "t", 0)
			if err != nil {
				return err
			}
			for j := range perTx {
				if _, err := p.Append(&Message{PublishedAt: int64(i + j), MaxRetry: -1, Value: val}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	var pages int
	err := db.View(func(tx *bolt.Tx) error {
		pb := tx.Bucket(bktTopics).Bucket([]byte("t")).Bucket(bktParts).Bucket(PartKey(0)).Bucket(bktMsgs)
		s := pb.Stats()
		pages = s.LeafPageN + s.LeafOverflowN + s.BranchPageN + s.BranchOverflowN
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ratio := float64(pages*db.Info().PageSize) / float64(total*len(val))
	t.Logf("%d pages of %d bytes for %d bytes of payload: %.2f×", pages, db.Info().PageSize, total*len(val), ratio)
	if ratio > 1.4 {
		t.Errorf("message pages hold %.2f× the payload, want ≤ 1.4×", ratio)
	}
}

// A Scanner answers every offset as Get and Head do, whether it steps to
// the next key or seeks: in order, with gaps, backwards, past the end, and
// on other partitions' keys.
func TestScannerMatchesGet(t *testing.T) {
	db := mustDB(t)
	mustPutTopic(t, db, "t", Patch{Partitions: ptrU32(2)})
	vals := make([]string, 3000) // several leaf pages
	at := make([]int64, len(vals))
	for i := range vals {
		vals[i], at[i] = fmt.Sprintf("v%d", i), int64(i)
	}
	mustAppend(t, db, "t", 0, at, vals...)
	mustAppend(t, db, "t", 1, at[:5], vals[:5]...)
	mustUpdate(t, db, func(tx *bolt.Tx) error {
		part, _ := OpenPartition(tx, "t", 0)
		_, err := part.TrimTo(10)
		return err
	})
	_ = db.View(func(tx *bolt.Tx) error {
		part, err := OpenPartition(tx, "t", 0)
		if err != nil {
			t.Fatal(err)
		}
		sc := part.Scanner()
		offs := []uint64{0, 1, 2, 9, 10, 11, 12, 12, 11, 13, 2999, 3000, 3001, 14, 15, 500}
		for i := uint64(16); i < 2999; i++ {
			offs = append(offs, i)
		}
		offs = append(offs, 3000, 5, 6, 20, 5, 21, 1)
		for _, off := range offs {
			want, err := part.Get(off)
			if err != nil {
				t.Fatal(err)
			}
			got, err := sc.Get(off)
			if err != nil {
				t.Fatal(err)
			}
			if (want == nil) != (got == nil) || want != nil && (got.Offset != want.Offset || string(got.Value) != string(want.Value)) {
				t.Fatalf("Scanner.Get(%d) = %+v, want %+v", off, got, want)
			}
			d, k, ok, err := sc.Head(off)
			wd, wk, wok, werr := part.Head(off)
			if d != wd || k != wk || ok != wok || err != werr {
				t.Fatalf("Scanner.Head(%d) = %d %q %v %v, want %d %q %v %v", off, d, k, ok, err, wd, wk, wok, werr)
			}
		}
		return nil
	})
}

func ptrU32(v uint32) *uint32 { return &v }
