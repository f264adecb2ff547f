// The leader's heap with a million pending delayed messages.
//
//	go test -run '^$' -bench PendingDelayedHeap ./bench/                       # both variants, 1 M entries
//	go test -run '^$' -bench 'PendingDelayedHeap/wheel' ./bench/               # in process only (seconds)
//	go test -run '^$' -bench 'PendingDelayedHeap/system' ./bench/ -heap.msgs=200000
//
// Both ignore b.N (see fixed) and report MiB of Go heap.

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqd/mqd/delay"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// wakeup is the leader's timer payload (replica/scheduler.go): the topic, a
// string shared by every timer of the topic, and whether it is a lease.
type wakeup struct {
	topic string
	lease bool
}

// BenchmarkPendingDelayedHeap measures what a million pending due times
// cost the leader.
//
// wheel: a delay.Wheel[wakeup] configured like the leader's (10 ms ticks)
// holding -heap.msgs timers due 1 to 2 hours ahead, all of one interned
// topic name, as raftfsm's scheduler adds them. Reports the heap it takes
// (HeapAlloc and HeapInuse after a GC, minus before) and B/entry.
//
// system: a single-node mqd; -heap.msgs messages are published with
// messages:batch (1000 per request, 4 publishers, delay_ms 1..2 h, 100-byte
// payloads: the payload lives in bbolt's mmap, not in the heap, and 1 KiB
// would only make the run longer), then a group fetches past all of them so
// that each sits in the group's ready index and in the leader's timing
// wheel. The node's heap is read from GET /metrics
// (go_memstats_heap_inuse_bytes, after GET /debug/pprof/heap?gc=1 made it
// collect): before publishing (heap_base_MiB); after (heap_published_MiB:
// raft's log cache of 1024 entries then holds the encoded batches); after
// 1100 one-message publishes to another topic pushed those out of the cache
// (heap_flushed_MiB); and with the wheel full (heap_MiB). wheel_MiB and
// B/entry are the last step's growth. msgs/s and the percentiles are the
// batch publishes'.
func BenchmarkPendingDelayedHeap(b *testing.B) {
	n := *flagHeapN
	b.Run(fmt.Sprintf("wheel/entries=%d", n), func(b *testing.B) {
		fixed(b, func(b *testing.B) []metric {
			now := time.Now()
			rng := rand.New(rand.NewPCG(1, 2))
			dues := make([]time.Time, n)
			for i := range dues {
				dues[i] = now.Add(time.Hour + time.Duration(rng.Int64N(int64(time.Hour))))
			}
			topic := strings.Clone("delayed-topic")
			inuse0, alloc0 := goHeap()
			w, err := delay.New[wakeup](delay.Config{Tick: 10 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range dues {
				w.Add(d, wakeup{topic: topic})
			}
			inuse1, alloc1 := goHeap()
			if w.Len() != n {
				b.Fatalf("wheel holds %d timers, want %d", w.Len(), n)
			}
			runtime.KeepAlive(w)
			runtime.KeepAlive(dues) // allocated before: its freeing must not offset the wheel
			grown := float64(alloc1) - float64(alloc0)
			return []metric{{grown / mib, "heap_MiB"}, {(float64(inuse1) - float64(inuse0)) / mib, "inuse_MiB"},
				{grown / float64(n), "B/entry"}}
		})
	})
	b.Run(fmt.Sprintf("system/msgs=%d", n), func(b *testing.B) {
		fixed(b, func(b *testing.B) []metric { return systemDelayedHeap(b, n) })
	})
}

func systemDelayedHeap(b *testing.B, n int) []metric {
	s := startSystem(b, 1)
	topic := s.topic(b, "delayed", nil)
	s.putGroup(b, topic, "g")
	heap := func(what string) float64 {
		inuse, alloc, err := nodeHeap(s.leader)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("leader heap %s: inuse %.1f MiB, alloc %.1f MiB", what, inuse/mib, alloc/mib)
		return inuse
	}
	base := heap("before publishing")

	const batch = 1000
	val := string(payload(100))
	var next atomic.Int64
	d := driver{workers: 4, next: func() (int64, bool) {
		i := next.Add(batch) - batch
		return i, i < int64(n)
	}}
	msgs, lat, elapsed, err := d.run(func(w int, i int64) (int, error) {
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		k := min(batch, n-int(i))
		ms := make([]batchMsg, k)
		for j := range ms {
			ms[j] = batchMsg{Value: val, DelayMs: int64(time.Hour/time.Millisecond) + rng.Int64N(int64(time.Hour/time.Millisecond))}
		}
		return k, s.publishBatch(context.Background(), topic, batchBody(ms), k)
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("published %d delayed messages in %v", msgs, elapsed.Round(time.Millisecond))
	published := heap("after publishing")

	// The raft log cache (1024 entries, raftfsm/node.go) still holds the
	// batches just published, ~130 KiB each. Push them out with small
	// entries (one-at-a-time publishes to another topic, one entry each) so
	// that the wheel's growth below is not offset by the cache shrinking.
	side := s.topic(b, "side", nil)
	if _, _, _, err := (driver{workers: 1, next: untilN(1100)}).run(s.publishOp(side, []byte("x"), false)); err != nil {
		b.Fatal(err)
	}
	flushed := heap("after 1100 small entries pushed the batches out of the raft log cache")

	// Fetch past them: each lease command moves up to 4096 of them (the
	// FSM's scan bound) into the ready index and the wheel, leasing none.
	ctx := context.Background()
	t0 := time.Now()
	for i := 1; ; i++ {
		got, _, err := s.leader.Fetch(ctx, topic, "g", tc.FetchRequest{Max: 1})
		if err != nil {
			b.Fatal(err)
		}
		if len(got) > 0 {
			b.Fatalf("fetched a message due an hour from now: %+v", got[0])
		}
		if i%25 != 0 {
			continue
		}
		st, err := s.leader.Stats(ctx, topic)
		if err != nil {
			b.Fatal(err)
		}
		g := st.Groups["g"]
		if g.Backlog == 0 && g.Delayed == int64(n) {
			b.Logf("%d fetches moved %d messages into the ready index in %v", i, g.Delayed, time.Since(t0).Round(time.Millisecond))
			break
		}
		if time.Since(t0) > 10*time.Minute {
			b.Fatalf("after %v: backlog %d, delayed %d", time.Since(t0), g.Backlog, g.Delayed)
		}
	}
	full := heap("with the wheel full")
	out := []metric{{float64(msgs) / elapsed.Seconds(), "msgs/s"}}
	out = append(out, latencyMetrics("", lat)...)
	return append(out,
		metric{base / mib, "heap_base_MiB"}, metric{published / mib, "heap_published_MiB"},
		metric{flushed / mib, "heap_flushed_MiB"}, metric{full / mib, "heap_MiB"},
		metric{(full - flushed) / mib, "wheel_MiB"}, metric{(full - flushed) / float64(n), "B/entry"})
}
