package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// result is what one workload measured on one system.
type result struct {
	msgs     int64         // messages completed inside the measuring window
	elapsed  time.Duration // length of the measuring window
	lat      []time.Duration
	errs     int64         // failed operations (anywhere, warm-up included)
	firstErr string        // the first of them
	note     string        // anything worth printing under the table
	cpu      time.Duration // the brokers' CPU time in the window (0: unknown)
}

// perCPU is messages per CPU-second of the brokers, or 0 if unknown.
func (r *result) perCPU() float64 {
	if r == nil || r.cpu <= 0 {
		return 0
	}
	return float64(r.msgs) / r.cpu.Seconds()
}

func (r *result) rate() float64 {
	if r == nil || r.elapsed <= 0 {
		return 0
	}
	return float64(r.msgs) / r.elapsed.Seconds()
}

func (r *result) percentile(q float64) time.Duration {
	if r == nil || len(r.lat) == 0 {
		return 0
	}
	i := int(q*float64(len(r.lat))+0.5) - 1
	return r.lat[max(0, min(i, len(r.lat)-1))]
}

// window is the measuring window of a time-based run: warm-up first, then
// [start, end). Work is counted by its completion time, so operations in
// flight at either edge neither inflate nor deflate the rate.
type window struct {
	start, end time.Time
}

func newWindow(warmup, dur time.Duration) window {
	s := time.Now().Add(warmup)
	return window{start: s, end: s.Add(dur)}
}

func (w window) in(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// errCounter counts failures and keeps the first message.
type errCounter struct {
	n     atomic.Int64
	first atomic.Value
}

func (e *errCounter) add(err error) {
	e.n.Add(1)
	e.first.CompareAndSwap(nil, err.Error())
}

func (e *errCounter) fill(r *result) {
	r.errs = e.n.Load()
	if s, ok := e.first.Load().(string); ok {
		r.firstErr = s
	}
}

// closedLoop runs workers goroutines, each calling op back to back until the
// window ends; op answers how many messages it completed. It returns the
// messages completed inside the window per second and the latencies of the
// operations that completed inside it.
func closedLoop(ctx context.Context, workers int, warmup, dur time.Duration, op func(ctx context.Context, worker int) (int, error)) *result {
	w := newWindow(warmup, dur)
	cpu := cpuBetween(w.start, w.end)
	ctx, cancel := context.WithDeadline(ctx, w.end.Add(30*time.Second))
	defer cancel()
	var (
		msgs atomic.Int64
		errs errCounter
		lat  = make([][]time.Duration, workers)
		wg   sync.WaitGroup
	)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(w.end) {
					return
				}
				n, err := op(ctx, i)
				t1 := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					errs.add(err)
					time.Sleep(10 * time.Millisecond) // no hot loop on a failing system
					continue
				}
				if w.in(t1) {
					msgs.Add(int64(n))
					lat[i] = append(lat[i], t1.Sub(t0))
				}
			}
		}()
	}
	wg.Wait()
	r := &result{msgs: msgs.Load(), elapsed: dur}
	if d := <-cpu; d > 0 {
		r.cpu = d
	}
	for _, l := range lat {
		r.lat = append(r.lat, l...)
	}
	slices.Sort(r.lat)
	errs.fill(r)
	return r
}

// payload returns size bytes of printable text (so that it can travel as a
// JSON string in mqd's batch body without escaping).
func payload(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

func errIfCanceled(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("interrupted: %w", err)
	}
	return nil
}
