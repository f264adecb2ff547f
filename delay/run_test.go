package delay

import (
	"context"
	"testing"
	"time"
)

// TestRunRealClock runs Run on the system clock: timers added while it idles
// fire never early, exactly once, within a few ticks; a cancelled one never
// fires; Run returns when its context ends. Lateness is also the machine's
// scheduling delay, so only a bound broken on every one of three attempts
// fails the test.
func TestRunRealClock(t *testing.T) {
	const tick, slack = 10 * time.Millisecond, 5 * 10 * time.Millisecond
	var worst time.Duration
	for range 3 {
		if worst = runOnce(t, tick); worst <= slack {
			return
		}
		t.Logf("a timer fired %v late", worst)
	}
	t.Fatalf("on every attempt a timer fired later than %v", slack)
}

// runOnce returns the worst lateness of one run of 60 timers over 200 ms.
func runOnce(t *testing.T, tick time.Duration) time.Duration {
	// 16 slots: level 0 spans 160 ms, so later timers cascade from level 1.
	w := mustNew[int](t, Config{Tick: tick, Slots: 16})
	type hit struct {
		id int
		at time.Time
	}
	hits := make(chan hit, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		w.Run(ctx, func(batch []int) {
			now := time.Now()
			for _, id := range batch {
				hits <- hit{id, now}
			}
		})
	}()
	time.Sleep(3 * tick) // Run is idle: only an Add wakes it
	start := time.Now()
	var dues []time.Time
	for i := range 60 {
		due := start.Add(time.Duration(i) * 10 * time.Millisecond / 3)
		if i == 0 {
			due = start.Add(-time.Second) // already due: fires within a tick of now
		}
		dues = append(dues, due)
		w.Add(due, i)
	}
	dues[0] = start
	if doomed := w.Add(start.Add(100*time.Millisecond), -1); !w.Cancel(doomed) {
		t.Fatal("Cancel of a pending timer = false")
	}
	var worst time.Duration
	deadline := time.After(time.Second)
	for seen := map[int]bool{}; len(seen) < len(dues); {
		select {
		case h := <-hits:
			if h.id < 0 || seen[h.id] {
				t.Fatalf("fired %d (seen before: %v)", h.id, seen[h.id])
			}
			seen[h.id] = true
			lat := h.at.Sub(dues[h.id])
			if lat < 0 {
				t.Fatalf("timer %d fired %v early", h.id, -lat)
			}
			worst = max(worst, lat)
		case <-deadline:
			t.Fatalf("only %d of %d fired within a second", len(seen), len(dues))
		}
	}
	cancel()
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	select {
	case h := <-hits:
		t.Fatalf("extra fire of %d", h.id)
	default:
	}
	return worst
}
