package delay

import (
	"context"
	"math"
	"time"
)

// maxSleep bounds Run's sleep while timers are pending, so a step of the
// wall clock is noticed within it.
const maxSleep = time.Second

// Run advances the wheel to the clock's now whenever the next non-empty
// level-0 slot ends or a slot must cascade, and calls fire with each
// non-empty batch (in due-time order) on Run's own goroutine; fire may call
// Add and Cancel and owns the slice. Run arms one timer, woken early by an
// Add due sooner; it returns when ctx ends. Run one at a time per wheel.
func (w *Wheel[T]) Run(ctx context.Context, fire func([]T)) {
	timer := time.NewTimer(maxSleep)
	defer timer.Stop()
	defer func() {
		w.mu.Lock()
		w.wakeNs = math.MinInt64
		w.mu.Unlock()
	}()
	for {
		w.mu.Lock()
		batch := w.advance(int64(w.clock.Now().Sub(w.origin)), nil)
		wake := w.nextWake()
		w.wakeNs = wake
		w.mu.Unlock()
		if len(batch) > 0 {
			fire(batch)
		}
		if wake == math.MaxInt64 {
			timer.Stop()
		} else {
			d := time.Duration(wake - max(int64(w.clock.Now().Sub(w.origin)), 0))
			timer.Reset(min(max(d, 0), maxSleep))
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-w.kick:
		}
	}
}

// nextWake returns when Run must next advance, in nanoseconds since origin:
// the end of the first non-empty level-0 tick, so that its timers fire in one
// batch, or the start of the next cascade; MaxInt64 if nothing is pending.
func (w *Wheel[T]) nextWake() int64 {
	if w.n == 0 {
		return math.MaxInt64
	}
	l0 := &w.levels[0]
	if l0.slots[l0.slotOf(w.cur)].head != nil {
		return w.tickEnd(w.cur)
	}
	wake := int64(math.MaxInt64)
	if f := w.nextFire(); f != math.MaxInt64 {
		wake = w.tickEnd(f)
	}
	if c := w.nextCascade(); c < math.MaxInt64/w.tickNs {
		wake = min(wake, c*w.tickNs)
	}
	return wake
}
