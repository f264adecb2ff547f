// The idempotency-key index (dedup.Index) at ten million keys.
//
//	go test -run '^$' -bench DedupIndex10M ./bench/                  # 10 M keys (named, so full size)
//	go test -run '^$' -bench DedupIndex10M ./bench/ -dedup.keys=200000   # quick
//	go test -run '^$' -bench . ./bench/ -bench.big                   # everything, 10 M keys included
//
// Size rule: -dedup.keys wins when set; otherwise 10 M when the -bench
// pattern names DedupIndex or -bench.big is set, and 1 M under any other
// pattern (so that `go test -bench . ./bench/` stays within minutes: 10 M
// random keys take a few minutes to build on a 2-core machine). The size is
// in the sub-benchmark names (keys=N).

package bench

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mqd/mqd/dedup"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// dedupKeys returns the index size and why.
func dedupKeys() (int, string) {
	switch {
	case *flagDedupN > 0:
		return *flagDedupN, "-dedup.keys"
	case *flagBig:
		return 10_000_000, "-bench.big"
	}
	if f := flag.Lookup("test.bench"); f != nil && strings.Contains(f.Value.String(), "DedupIndex") {
		return 10_000_000, "-bench names DedupIndex"
	}
	return 1_000_000, "default under a -bench pattern that does not name DedupIndex (-bench DedupIndex10M, -bench.big or -dedup.keys for more)"
}

var (
	bktDedupParent = []byte("topic")
	bktDedupKeys   = []byte("idempotency_keys")
)

// dedupPayload is what the publish index stores: a partition and an offset
// (fsm.encodePlacement: two uvarints).
var dedupPayload = []byte{0x00, 0xc0, 0x84, 0x3d}

// putKeySeq numbers the keys the put sub-benchmark adds, above the built ones.
var putKeySeq atomic.Uint64

// BenchmarkDedupIndex10M builds a publish idempotency-key index of N random
// 32-hex-digit keys (see dedupKeys for N; 100k keys per write transaction,
// bbolt opened like the FSM's: NoSync, no freelist sync, map freelist) and
// measures it at that size:
//
//   - heap: the Go heap (runtime.ReadMemStats after runtime.GC) before and
//     after the build, HeapInuse and HeapAlloc in MiB, with the build time
//     and the file's size: the keys live in the bbolt file, mapped, not in
//     the heap, so the heap must not grow with N. keys_MiB and expiry_MiB
//     are the pages of the index's two B+trees (the keys, inserted at
//     random; the expiry entries, appended in expiry order).
//   - get-hit, get-miss: Index.Get of a stored key / of a key never stored,
//     in one read transaction; ns/op and allocs/op.
//   - put: Index.Put of new keys (lookup of the old entry, key entry, expiry
//     entry), 100k per write transaction, commit included.
func BenchmarkDedupIndex10M(b *testing.B) {
	n, why := dedupKeys()
	b.Logf("index of %d keys (%s)", n, why)
	db := openBolt(b)
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := dedup.Init(tx); err != nil {
			return err
		}
		_, err := tx.CreateBucket(bktDedupParent)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	open := func(tx *bolt.Tx) *dedup.Index {
		ix, err := dedup.Open(tx, tx.Bucket(bktDedupParent), bktDedupKeys, dedup.KindPublish, "t", "")
		if err != nil {
			b.Fatal(err)
		}
		return ix
	}
	now := time.Now().UnixMilli()
	expires := now + 7*24*3600*1000 // the default window; + i: later keys expire later
	const perTx = 100_000
	put := func(from, to uint64) {
		if err := db.Update(func(tx *bolt.Tx) error {
			ix := open(tx)
			var key []byte
			for i := from; i < to; i++ {
				key = randomKey(key[:0], i)
				if err := ix.Put(key, dedupPayload, expires+int64(i)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}

	inuse0, alloc0 := goHeap()
	start := time.Now()
	for lo := 0; lo < n; lo += perTx {
		put(uint64(lo), uint64(min(lo+perTx, n)))
		if lo > 0 && lo%(10*perTx) == 0 {
			b.Logf("%d keys after %v", lo, time.Since(start).Round(time.Second))
		}
	}
	build := time.Since(start)
	inuse1, alloc1 := goHeap()
	fi, err := os.Stat(db.Path())
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("built %d keys in %v (%.0f keys/s); file %d MiB; heap inuse %.1f -> %.1f MiB, alloc %.1f -> %.1f MiB",
		n, build.Round(time.Millisecond), float64(n)/build.Seconds(), fi.Size()/mib,
		float64(inuse0)/mib, float64(inuse1)/mib, float64(alloc0)/mib, float64(alloc1)/mib)
	putKeySeq.Store(uint64(n))
	// The pages each of the index's two B+trees occupies: the keys (random
	// inserts) and the expiry entries (appended in expiry order).
	var keysMiB, expiryMiB float64
	if err := db.View(func(tx *bolt.Tx) error {
		pages := func(bk *bolt.Bucket) float64 {
			st := bk.Stats()
			return float64(st.BranchPageN+st.BranchOverflowN+st.LeafPageN+st.LeafOverflowN) * float64(db.Info().PageSize) / mib
		}
		keysMiB = pages(tx.Bucket(bktDedupParent).Bucket(bktDedupKeys))
		expiryMiB = pages(tx.Bucket([]byte("dedup_expiry")))
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.Logf("pages: keys %.1f MiB, expiry entries %.1f MiB", keysMiB, expiryMiB)

	name := fmt.Sprintf("keys=%d/", n)
	b.Run(name+"heap", func(b *testing.B) {
		fixed(b, func(*testing.B) []metric {
			return []metric{
				{float64(inuse0) / mib, "inuse_before_MiB"}, {float64(inuse1) / mib, "inuse_after_MiB"},
				{float64(alloc0) / mib, "alloc_before_MiB"}, {float64(alloc1) / mib, "alloc_after_MiB"},
				{float64(fi.Size()) / mib, "file_MiB"}, {build.Seconds(), "build_s"},
				{keysMiB, "keys_MiB"}, {expiryMiB, "expiry_MiB"},
			}
		})
	})

	const lookups = 1 << 16
	rng := rand.New(rand.NewPCG(11, 12))
	hits := make([][]byte, lookups)
	misses := make([][]byte, lookups)
	for i := range hits {
		hits[i] = randomKey(nil, rng.Uint64N(uint64(n)))
		misses[i] = randomKey(nil, 1<<62+rng.Uint64()>>2)
	}
	get := func(keys [][]byte, want bool) func(b *testing.B) {
		return func(b *testing.B) {
			if err := db.View(func(tx *bolt.Tx) error {
				ix := open(tx)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if _, ok := ix.Get(keys[i%lookups], now); ok != want {
						b.Fatalf("Get(%s) found %v, want %v", keys[i%lookups], ok, want)
					}
				}
				b.StopTimer()
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run(name+"get-hit", get(hits, true))
	b.Run(name+"get-miss", get(misses, false))
	b.Run(name+"put", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; done += perTx {
			k := uint64(min(perTx, b.N-done))
			from := putKeySeq.Add(k) - k
			put(from, from+k)
		}
	})
}

// Key-index layouts side by side (issue 24: a key index whose cost does
// not depend on key randomness). Not the FSM's code: a measurement of the
// two write patterns at the same size, to choose the design by.
//
//	go test -run '^$' -bench DedupLayouts -benchtime 200000x ./bench/ -dedup.keys=1000000
//
// Each sub-benchmark opens a bbolt file like the FSM's (8 KiB pages,
// NoSync), fills a key bucket with N keys (sorted, leaves 75 % full, as a
// tree built by random inserts ends up), then records b.N new random keys,
// batch per write transaction (16: a c=16 publisher's group commit; 512:
// BenchmarkFSMApplyBatch's entry), each looked up first:
//
//   - btree: today's dedup.Index: Get, then Put (the key's entry on a
//     random leaf, and its expiry entry).
//   - log+merge: the key appended to a commit-order log bucket (seq key,
//     full leaves), its 64-bit hash noted in a bounded in-memory table
//     (pendingCap entries, flat in N), looked up in the table and then in
//     the key bucket; when the log holds pendingCap keys they are sorted
//     and written into the key bucket in one pass (the merge is timed
//     inside the transaction that triggers it), so a leaf is dirtied once
//     per merge, not once per key.
//   - log+runs: as log+merge, but each full log is sorted into a run
//     bucket of its own (appended in key order, full leaves) instead of
//     merged into the key bucket; a lookup then reads the table, the key
//     bucket and every run (what a filter in front of the runs would have
//     to save).
//   - log+filter: as log+runs, and the whole key set is runs (the N keys
//     filled as runs of pendingCap keys); a lookup reads one row of a
//     filter directory in the file (a bucket keyed by block number whose
//     value holds one 512-bit Bloom block per run, 10 bits per key) and
//     reads only the runs whose block says maybe. Sealing a run appends
//     its block to every row. Nothing per key in the Go heap, and no
//     expiry entry per key: a run expires whole, once the latest expiry
//     of its keys (kept with it) has passed.
//   - none: the transactions without keys (each writes one meta value):
//     the floor the others are measured against.
//
// ns/op is per key, commit included; cpu_us/key the process's CPU per key
// over the same span (GC included); pages/key is bbolt's page writes per
// key (TxStats.Write); merge_max_ms the longest transaction.
func BenchmarkDedupLayouts(b *testing.B) {
	n := 1_000_000
	if *flagDedupN > 0 {
		n = *flagDedupN
	}
	for _, batch := range []int{16, 512} {
		for _, layout := range []string{"none", "btree", "log+merge", "log+runs", "log+filter"} {
			b.Run(fmt.Sprintf("keys=%d/batch=%d/%s", n, batch, layout), func(b *testing.B) {
				benchLayout(b, n, batch, layout)
			})
		}
	}
}

// pendingCap bounds the log+merge layout's in-memory table: 64 Ki hashes
// (about 1.5 MiB of map), whatever the number of keys held.
const pendingCap = 1 << 16

var (
	bktLayoutLog = []byte("key_log")
	bktLayoutExp = []byte("dedup_expiry")
)

func benchLayout(b *testing.B, n, batch int, layout string) {
	deferred := layout != "btree" && layout != "none"
	filtered := layout == "log+filter"
	var runs [][]byte
	opts := *boltOpts
	opts.PageSize = 8 << 10
	db, err := bolt.Open(b.TempDir()+"/layout.db", 0o600, &opts)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UnixMilli()
	expires := now + 7*24*3600*1000
	if err := fillSorted(db, n*btoi(!filtered), expires); err != nil {
		b.Fatal(err)
	}
	if filtered {
		if runs, err = fillRuns(db, n, expires); err != nil {
			b.Fatal(err)
		}
	}
	pending := make(map[uint64]uint64, pendingCap) // hash -> log seq
	var seq uint64
	var key []byte
	var longest time.Duration
	runtime.GC() // the fill's garbage is not the layout's
	w0, cpu0 := pageWrites(db), processCPU()
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		t0 := time.Now()
		if err := db.Update(func(tx *bolt.Tx) error {
			kb, lb, exp := tx.Bucket(bktDedupParent).Bucket(bktDedupKeys), tx.Bucket(bktLayoutLog), tx.Bucket(bktLayoutExp)
			lb.FillPercent = 1.0
			if layout == "none" {
				return lb.Put([]byte("meta"), mlog.U64Key(uint64(done)))
			}
			for j := range min(batch, b.N-done) {
				key = randomKey(key[:0], uint64(n+done+j))
				e := expires + int64(done+j)
				if !deferred {
					ix, err := dedup.Open(tx, tx.Bucket(bktDedupParent), bktDedupKeys, dedup.KindPublish, "t", "")
					if err != nil {
						return err
					}
					if _, ok := ix.Get(key, now); ok {
						return fmt.Errorf("key %s found", key)
					}
					if err := ix.Put(key, dedupPayload, e); err != nil {
						return err
					}
					continue
				}
				h := layoutHash(key)
				if s, ok := pending[h]; ok && bytes.Equal(lb.Get(mlog.U64Key(s))[8:], key) {
					return fmt.Errorf("key %s found in the log", key)
				}
				if v := kb.Get(key); v != nil {
					return fmt.Errorf("key %s found", key)
				}
				if err := probeRuns(tx, runs, key, h, filtered); err != nil {
					return err
				}
				seq++
				v := binary.BigEndian.AppendUint64(nil, uint64(e))
				if err := lb.Put(mlog.U64Key(seq), append(v, key...)); err != nil {
					return err
				}
				pending[h] = seq
				if filtered {
					continue // runs expire whole: no expiry entry per key
				}
				ek := binary.BigEndian.AppendUint64(nil, uint64(e))
				if err := exp.Put(append(append(ek, 'p', 1, 't', 0), key...), nil); err != nil {
					return err
				}
			}
			if deferred && len(pending) >= pendingCap {
				clear(pending)
				if layout == "log+merge" {
					_, err := mergeLog(tx, bktDedupKeys)
					return err
				}
				runs = append(runs, fmt.Appendf(nil, "run%d", len(runs)))
				keys, err := mergeLog(tx, runs[len(runs)-1])
				if err != nil || !filtered {
					return err
				}
				return addFilterColumn(tx, keys)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		longest = max(longest, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu_us/key")
	b.ReportMetric(float64(pageWrites(db)-w0)/float64(b.N), "pages/key")
	b.ReportMetric(float64(longest)/float64(time.Millisecond), "merge_max_ms")
}

// processCPU is this process's user and system CPU time so far: on a
// machine shared with other jobs it is steadier than wall time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func pageWrites(db *bolt.DB) int64 {
	st := db.Stats()
	return st.TxStats.GetWrite()
}

// layoutHash is FNV-1a, 64 bits.
func layoutHash(k []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range k {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// mergeLog writes the log's keys into bucket name (created if missing, as
// a run: full leaves) in key order, empties the log, and returns the keys.
func mergeLog(tx *bolt.Tx, name []byte) ([][]byte, error) {
	lb, kb := tx.Bucket(bktLayoutLog), tx.Bucket(bktDedupParent).Bucket(name)
	if kb == nil {
		var err error
		if kb, err = tx.Bucket(bktDedupParent).CreateBucket(name); err != nil {
			return nil, err
		}
		kb.FillPercent = 1.0
	}
	type ent struct{ k, v []byte }
	var all []ent
	if err := lb.ForEach(func(_, v []byte) error {
		val := append(bytes.Clone(v[:8]), dedupPayload...)
		all = append(all, ent{bytes.Clone(v[8:]), val})
		return nil
	}); err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b ent) int { return bytes.Compare(a.k, b.k) })
	keys := make([][]byte, len(all))
	for i, e := range all {
		if err := kb.Put(e.k, e.v); err != nil {
			return nil, err
		}
		keys[i] = e.k
	}
	if err := tx.DeleteBucket(bktLayoutLog); err != nil {
		return nil, err
	}
	_, err := tx.CreateBucket(bktLayoutLog)
	return keys, err
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// The log+filter layout's directory: filterBlocks rows, one 64-byte Bloom
// block per run in each (10 bits per key of a pendingCap-key run), k = 7
// bits per key inside one block.
const (
	filterBlocks = pendingCap * 10 / 512
	filterK      = 7
)

var bktFilterDir = []byte("filter_dir")

func filterBits(h uint64, f func(bit uint32) bool) bool {
	h1, h2 := uint32(h), uint32(h>>32)|1
	for i := range uint32(filterK) {
		if !f((h1 + i*h2) % 512) {
			return false
		}
	}
	return true
}

func filterRow(h uint64) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32((h>>40)%filterBlocks))
}

// addFilterColumn appends the Bloom blocks of a new run's keys to every
// row of the directory.
func addFilterColumn(tx *bolt.Tx, keys [][]byte) error {
	dir, err := tx.Bucket(bktDedupParent).CreateBucketIfNotExists(bktFilterDir)
	if err != nil {
		return err
	}
	blocks := make([]byte, filterBlocks*64)
	for _, k := range keys {
		h := layoutHash(k)
		blk := blocks[int((h>>40)%filterBlocks)*64:][:64]
		filterBits(h, func(bit uint32) bool { blk[bit/8] |= 1 << (bit % 8); return true })
	}
	for i := range filterBlocks {
		rk := binary.BigEndian.AppendUint32(nil, uint32(i))
		row := append(bytes.Clone(dir.Get(rk)), blocks[i*64:(i+1)*64]...)
		if err := dir.Put(rk, row); err != nil {
			return err
		}
	}
	return nil
}

// probeRuns fails if key is in any run: every run, or (filtered) only
// those whose Bloom block in the key's directory row says maybe.
func probeRuns(tx *bolt.Tx, runs [][]byte, key []byte, h uint64, filtered bool) error {
	parent := tx.Bucket(bktDedupParent)
	var row []byte
	if filtered {
		row = parent.Bucket(bktFilterDir).Get(filterRow(h))
	}
	for i, r := range runs {
		if filtered {
			blk := row[i*64:][:64]
			if !filterBits(h, func(bit uint32) bool { return blk[bit/8]&(1<<(bit%8)) != 0 }) {
				continue
			}
		}
		if parent.Bucket(r).Get(key) != nil {
			return fmt.Errorf("key %s found in a run", key)
		}
	}
	return nil
}

// fillRuns stores keys 0..n-1 as runs of pendingCap keys, each with its
// filter column, and returns the runs' bucket names.
func fillRuns(db *bolt.DB, n int, expires int64) ([][]byte, error) {
	var runs [][]byte
	v := binary.BigEndian.AppendUint64(nil, uint64(expires))
	for lo := 0; lo < n; lo += pendingCap {
		keys := make([][]byte, 0, pendingCap)
		for i := lo; i < min(lo+pendingCap, n); i++ {
			keys = append(keys, randomKey(nil, uint64(i)))
		}
		slices.SortFunc(keys, bytes.Compare)
		name := fmt.Appendf(nil, "run%d", len(runs))
		if err := db.Update(func(tx *bolt.Tx) error {
			rb, err := tx.Bucket(bktDedupParent).CreateBucket(name)
			if err != nil {
				return err
			}
			rb.FillPercent = 1.0
			for _, k := range keys {
				if err := rb.Put(k, append(v, dedupPayload...)); err != nil {
					return err
				}
			}
			return addFilterColumn(tx, keys)
		}); err != nil {
			return nil, err
		}
		runs = append(runs, name)
	}
	return runs, nil
}

// fillSorted creates the layout buckets and puts n keys into the key
// bucket in key order, leaves 75 % full.
func fillSorted(db *bolt.DB, n int, expires int64) error {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = randomKey(nil, uint64(i))
	}
	slices.SortFunc(keys, bytes.Compare)
	v := binary.BigEndian.AppendUint64(nil, uint64(expires))
	v = append(v, dedupPayload...)
	for lo := 0; lo < n || lo == 0; lo += 200_000 {
		if err := db.Update(func(tx *bolt.Tx) error {
			p, err := tx.CreateBucketIfNotExists(bktDedupParent)
			if err != nil {
				return err
			}
			kb, err := p.CreateBucketIfNotExists(bktDedupKeys)
			if err != nil {
				return err
			}
			for _, name := range [][]byte{bktLayoutLog, bktLayoutExp} {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			kb.FillPercent = 0.75
			for _, k := range keys[lo:min(lo+200_000, n)] {
				if err := kb.Put(k, v); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}
