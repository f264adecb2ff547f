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
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqd/mqd/dedup"
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
//     the heap, so the heap must not grow with N.
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

	name := fmt.Sprintf("keys=%d/", n)
	b.Run(name+"heap", func(b *testing.B) {
		fixed(b, func(*testing.B) []metric {
			return []metric{
				{float64(inuse0) / mib, "inuse_before_MiB"}, {float64(inuse1) / mib, "inuse_after_MiB"},
				{float64(alloc0) / mib, "alloc_before_MiB"}, {float64(alloc1) / mib, "alloc_after_MiB"},
				{float64(fi.Size()) / mib, "file_MiB"}, {build.Seconds(), "build_s"},
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
