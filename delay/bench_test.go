package delay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

const million = 1_000_000

// payload is the small payload of the benchmarks: a partition and an offset.
type payload struct {
	a uint32
	b uint64
}

// benchDues returns n due times after now, log-uniform from one tick to 90
// days: the mix of lease expiries, retry back-offs and delayed messages.
func benchDues(now time.Time, n int) []time.Time {
	rng := rand.New(rand.NewPCG(3, 4))
	d := make([]time.Time, n)
	for i := range d {
		d[i] = now.Add(logUniform(rng, 10*time.Millisecond, 90*24*time.Hour))
	}
	return d
}

func fill(w *Wheel[payload], dues []time.Time) []*Timer[payload] {
	hs := make([]*Timer[payload], len(dues))
	for i, d := range dues {
		hs[i] = w.Add(d, payload{uint32(i), uint64(i)})
	}
	return hs
}

// BenchmarkInsert adds timers to a wheel holding 1M to 2M of them.
func BenchmarkInsert(b *testing.B) {
	clk := newFakeClock()
	w := mustNew[payload](b, Config{Clock: clk})
	dues := benchDues(clk.Now(), million)
	fill(w, dues)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%million == 0 {
			b.StopTimer()
			w.Reset()
			fill(w, dues)
			b.StartTimer()
		}
		w.Add(dues[i%million], payload{uint32(i), uint64(i)})
	}
}

// BenchmarkCancel cancels timers, in random order, of a wheel holding 1M to
// 2M of them.
func BenchmarkCancel(b *testing.B) {
	clk := newFakeClock()
	w := mustNew[payload](b, Config{Clock: clk})
	dues := benchDues(clk.Now(), million)
	fill(w, dues)
	rng := rand.New(rand.NewPCG(5, 6))
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		n := min(b.N-done, million)
		hs := fill(w, dues[:n])
		rng.Shuffle(n, func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
		b.StartTimer()
		for _, h := range hs {
			w.Cancel(h)
		}
		done += n
	}
}

// BenchmarkAdvance advances one tick per op through 1M timers: sparse has
// about one due per tick (spread over 10^6 ticks, so most cascade down from
// levels 1 and 2), dense about a thousand (spread over 10 s).
func BenchmarkAdvance(b *testing.B) {
	for _, c := range []struct {
		name  string
		ticks int64
	}{{"sparse", million}, {"dense", 1000}} {
		b.Run(c.name, func(b *testing.B) {
			clk := newFakeClock()
			w := mustNew[payload](b, Config{Clock: clk})
			rng := rand.New(rand.NewPCG(7, 8))
			dues := make([]time.Time, million)
			refill := func() {
				now := clk.Now()
				for i := range dues {
					dues[i] = now.Add(time.Duration(rng.Int64N(c.ticks * int64(DefaultTick))))
				}
				fill(w, dues)
			}
			refill()
			fired := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if w.Len() == 0 {
					b.StopTimer()
					refill()
					b.StartTimer()
				}
				fired += len(w.Advance(clk.Add(DefaultTick)))
			}
			b.ReportMetric(float64(fired)/float64(b.N), "fired/op")
			if fired > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(fired), "ns/fired")
			}
		})
	}
}

// heapOf1M returns the heap a wheel of 1M small timers takes, per timer in
// bytes and in all in MiB.
func heapOf1M(tb testing.TB) (perEntry, mib float64) {
	clk := newFakeClock()
	dues := benchDues(clk.Now(), million)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := mustNew[payload](tb, Config{Clock: clk})
	for i, d := range dues {
		w.Add(d, payload{uint32(i), uint64(i)})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if w.Len() != million {
		tb.Fatalf("Len = %d", w.Len())
	}
	runtime.KeepAlive(w)
	runtime.KeepAlive(dues) // allocated before: its freeing must not offset the wheel
	grown := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	return grown / million, grown / (1 << 20)
}

// BenchmarkHeap1M reports the heap a wheel of 1M timers takes.
func BenchmarkHeap1M(b *testing.B) {
	var per, mib float64
	for range b.N {
		per, mib = heapOf1M(b)
	}
	b.ReportMetric(per, "B/entry")
	b.ReportMetric(mib, "MiB")
}

// BenchmarkLateness runs Run on the system clock with 100k timers due over
// 2 s and reports how late they fire (fire time minus due) in ms.
func BenchmarkLateness(b *testing.B) {
	for _, tick := range []time.Duration{DefaultTick, time.Millisecond} {
		b.Run(fmt.Sprint("tick=", tick), func(b *testing.B) {
			var lat []float64
			for range b.N {
				lat = lateness(b, tick, 100_000, 2*time.Second)
			}
			slices.Sort(lat)
			pct := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))] }
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(lat[len(lat)-1], "max-ms")
		})
	}
}

func lateness(b *testing.B, tick time.Duration, n int, over time.Duration) []float64 {
	w := mustNew[int](b, Config{Tick: tick})
	start := time.Now().Add(50 * time.Millisecond)
	rng := rand.New(rand.NewPCG(9, 10))
	dues := make([]time.Time, n)
	for i := range dues {
		dues[i] = start.Add(time.Duration(rng.Int64N(int64(over))))
	}
	lat := make([]float64, n)
	var left atomic.Int64
	left.Store(int64(n))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go w.Run(ctx, func(batch []int) {
		now := time.Now()
		for _, i := range batch {
			lat[i] = float64(now.Sub(dues[i])) / float64(time.Millisecond)
		}
		if left.Add(-int64(len(batch))) == 0 {
			close(done)
		}
	})
	for i, d := range dues {
		w.Add(d, i)
	}
	select {
	case <-done:
	case <-time.After(over + 5*time.Second):
		b.Fatalf("%d of %d timers still pending", left.Load(), n)
	}
	cancel()
	return lat
}
