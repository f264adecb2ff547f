package delay

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func mustNew[T any](t testing.TB, cfg Config) *Wheel[T] {
	t.Helper()
	w, err := New[T](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// logUniform returns a duration between lo and hi, uniform in its logarithm.
func logUniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return time.Duration(math.Exp(l + rng.Float64()*(h-l)))
}

// occupancy counts the pending timers of each level, overflow last.
func occupancy[T any](w *Wheel[T]) []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := make([]int, len(w.levels)+1)
	for k := range w.levels {
		for i := range w.levels[k].slots {
			for t := w.levels[k].slots[i].head; t != nil; t = t.next {
				n[k]++
			}
		}
	}
	for t := w.overflow.head; t != nil; t = t.next {
		n[len(w.levels)]++
	}
	return n
}

func TestConfigValidate(t *testing.T) {
	good := []Config{{}, {Tick: MinTick}, {Tick: MaxTick, Slots: 2}, {Tick: time.Millisecond, Slots: MaxSlots}}
	for _, c := range good {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	bad := []Config{{Tick: -1}, {Tick: MinTick - 1}, {Tick: MaxTick + 1}, {Slots: -4}, {Slots: 1}, {Slots: 48}, {Slots: 2 * MaxSlots}}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ErrInvalidConfig", c, err)
		}
		if _, err := New[int](c); err == nil {
			t.Errorf("New(%+v) accepted it", c)
		}
	}
}

func TestLevelsSpan(t *testing.T) {
	for _, c := range []struct {
		cfg    Config
		levels int
	}{{Config{}, 5}, {Config{Slots: 2}, 32}, {Config{Slots: 4}, 16}, {Config{Slots: 4096}, 3}, {Config{Slots: MaxSlots}, 2}} {
		w := mustNew[int](t, c.cfg)
		if len(w.levels) != c.levels || w.topShift < spanBits {
			t.Errorf("slots %d: %d levels spanning 2^%d ticks, want %d levels spanning >= 2^%d",
				c.cfg.Slots, len(w.levels), w.topShift, c.levels, spanBits)
		}
	}
}

// TestRandomAcrossLevels checks Advance against a model: entries at
// log-uniform due times from the past to past the top level's horizon, time
// advanced in random steps of every scale (sub-tick, to an exact due time,
// a fraction of the elapsed time), with adds and cancels along the way.
func TestRandomAcrossLevels(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		horizon time.Duration
	}{
		{"default", Config{}, 4 * 365 * 24 * time.Hour},                          // top level spans ~497 days
		{"tiny", Config{Tick: time.Millisecond, Slots: 4}, 200 * 24 * time.Hour}, // 16 levels spanning ~50 days
	} {
		t.Run(tc.name, func(t *testing.T) { checkRandom(t, tc.cfg, tc.horizon) })
	}
}

type model struct {
	t       *testing.T
	w       *Wheel[int]
	clk     *fakeClock
	rng     *rand.Rand
	horizon time.Duration
	due     []time.Time
	handle  []*Timer[int]
	pending map[int]bool
	done    map[int]bool // fired or cancelled
}

func (m *model) add(base time.Time) {
	id := len(m.due)
	var d time.Time
	switch r := m.rng.IntN(20); {
	case r == 0:
		d = base.Add(-logUniform(m.rng, time.Nanosecond, 1000*time.Hour)) // already past
	case r == 1:
		d = base // exactly now
	case r == 2 && len(m.due) > 0:
		d = m.due[m.rng.IntN(len(m.due))] // a duplicate due time
	default:
		d = base.Add(logUniform(m.rng, time.Microsecond, m.horizon))
	}
	m.due = append(m.due, d)
	m.handle = append(m.handle, m.w.Add(d, id))
	m.pending[id] = true
}

func (m *model) cancelSome() {
	id := m.rng.IntN(len(m.due))
	got := m.w.Cancel(m.handle[id])
	if got != m.pending[id] {
		m.t.Fatalf("Cancel(%d) = %v, pending %v", id, got, m.pending[id])
	}
	delete(m.pending, id)
	m.done[id] = true
}

func (m *model) advance(now time.Time) {
	m.t.Helper()
	got := m.w.Advance(now)
	for i, id := range got {
		if !m.pending[id] {
			m.t.Fatalf("at %v: fired %d (due %v), which is not pending (done %v)", now, id, m.due[id], m.done[id])
		}
		if m.due[id].After(now) {
			m.t.Fatalf("at %v: fired %d early, due %v", now, id, m.due[id])
		}
		if i > 0 && m.due[id].Before(m.due[got[i-1]]) {
			m.t.Fatalf("at %v: batch out of due order: %v then %v", now, m.due[got[i-1]], m.due[id])
		}
		delete(m.pending, id)
		m.done[id] = true
	}
	for id := range m.pending {
		if !m.due[id].After(now) {
			m.t.Fatalf("at %v: %d due %v left behind (%d fired)", now, id, m.due[id], len(got))
		}
	}
	if n := m.w.Len(); n != len(m.pending) {
		m.t.Fatalf("Len = %d, want %d", n, len(m.pending))
	}
}

func checkRandom(t *testing.T, cfg Config, horizon time.Duration) {
	clk := newFakeClock()
	cfg.Clock = clk
	m := &model{t: t, w: mustNew[int](t, cfg), clk: clk, rng: rand.New(rand.NewPCG(1, 2)),
		horizon: horizon, pending: map[int]bool{}, done: map[int]bool{}}
	start := clk.Now()
	for range 20000 {
		m.add(start)
	}
	occ := occupancy(m.w)
	for k, n := range occ {
		if n == 0 {
			t.Fatalf("level %d of %d is empty (overflow last): %v", k, len(occ)-1, occ)
		}
	}
	tick := m.w.tickNs
	steps := 0
	for now := start; len(m.pending) > 0; steps++ {
		var step time.Duration
		switch r := m.rng.IntN(20); {
		case r == 0:
		case r < 4:
			step = time.Duration(m.rng.Int64N(2 * tick))
		case r < 6:
			step = m.nextDue().Sub(now)
		default:
			// a fraction of the elapsed time, from 1/10^5 to 1/5
			step = max(1, time.Duration(float64(now.Sub(start))*float64(logUniform(m.rng, 1, 20000))/1e5))
		}
		now = clk.Add(step)
		m.advance(now)
		if m.rng.IntN(4) == 0 && steps < 10000 {
			m.add(now)
		}
		if m.rng.IntN(4) == 0 {
			m.cancelSome()
		}
		if steps > 1e5 {
			t.Fatalf("no end in sight: %d pending", len(m.pending))
		}
	}
	t.Logf("%d steps, %d timers, levels+overflow at start %v", steps, len(m.due), occ)
	for id, h := range m.handle {
		if m.w.Cancel(h) {
			t.Fatalf("Cancel(%d) after it fired or was cancelled returned true", id)
		}
	}
}

func (m *model) nextDue() time.Time {
	var best time.Time
	for id := range m.pending {
		if best.IsZero() || m.due[id].Before(best) {
			best = m.due[id]
		}
	}
	return best
}

func TestAdvanceExact(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[string](t, Config{Clock: clk})
	now := clk.Now()
	due := now.Add(15 * time.Millisecond) // mid-tick
	w.Add(due, "a")
	w.Add(due.Add(time.Nanosecond), "b")
	for _, at := range []time.Time{now, now.Add(10 * time.Millisecond), due.Add(-1)} {
		if got := w.Advance(at); got != nil {
			t.Fatalf("Advance(%v) = %v, want nothing", at.Sub(now), got)
		}
	}
	if got := w.Advance(due); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("Advance(due) = %v, want [a]", got)
	}
	if got := w.Advance(due.Add(time.Nanosecond)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Advance(due+1ns) = %v, want [b]", got)
	}
}

func TestPastDueFiresOnNextAdvance(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[int](t, Config{Clock: clk})
	now := clk.Add(time.Hour)
	w.Advance(now)
	w.Add(now, 1)                            // due exactly now
	w.Add(now.Add(-3*time.Millisecond), 2)   // earlier in the current tick
	w.Add(now.Add(-time.Minute), 3)          // a wheel turn ago
	w.Add(time.Unix(0, 0), 4)                // long before the wheel existed
	w.Add(now.Add(-100*365*24*time.Hour), 5) // beyond Duration's range
	if got := w.Advance(now); !slices.Equal(got, []int{5, 4, 3, 2, 1}) {
		t.Fatalf("Advance(now) = %v, want all five in due order", got)
	}
	// The wheel's time never moves back: a timer added due between the
	// clock's step back and the wheel's time still fires.
	w.Add(now.Add(-time.Second), 6)
	if got := w.Advance(now.Add(-2 * time.Second)); !slices.Equal(got, []int{6}) {
		t.Fatalf("Advance(earlier) = %v, want [6]", got)
	}
	if w.Len() != 0 {
		t.Fatalf("Len = %d", w.Len())
	}
}

func TestCancel(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[int](t, Config{Clock: clk})
	now := clk.Now()
	var hs []*Timer[int]
	for i := range 10 {
		hs = append(hs, w.Add(now.Add(time.Duration(i)*time.Second), i))
	}
	far := w.Add(now.Add(3*365*24*time.Hour), 99) // on the overflow list
	for _, i := range []int{0, 4, 9} {
		if !w.Cancel(hs[i]) {
			t.Fatalf("Cancel(%d) = false on a pending timer", i)
		}
		if w.Cancel(hs[i]) {
			t.Fatalf("second Cancel(%d) = true", i)
		}
	}
	if !w.Cancel(far) || w.Cancel(nil) {
		t.Fatal("Cancel of the overflow timer or of nil is wrong")
	}
	if w.Len() != 7 {
		t.Fatalf("Len = %d, want 7", w.Len())
	}
	got := w.Advance(now.Add(5 * time.Second))
	if !slices.Equal(got, []int{1, 2, 3, 5}) {
		t.Fatalf("Advance = %v, want [1 2 3 5]", got)
	}
	if w.Cancel(hs[2]) {
		t.Fatal("Cancel after fire = true")
	}
	if got := w.Advance(now.Add(10 * 365 * 24 * time.Hour)); !slices.Equal(got, []int{6, 7, 8}) {
		t.Fatalf("Advance = %v, want [6 7 8]", got)
	}
	if w.Len() != 0 {
		t.Fatalf("Len = %d", w.Len())
	}
}

func TestReset(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[int](t, Config{Clock: clk})
	now := clk.Now()
	old := w.Add(now.Add(time.Second), 1)
	w.Add(now.Add(-time.Second), 2)
	w.Add(now.Add(1000*24*time.Hour), 3)
	now = clk.Add(time.Minute) // Reset catches up with the clock
	w.Reset()
	if w.Len() != 0 || w.Cancel(old) {
		t.Fatalf("after Reset: Len %d, Cancel of an old timer true", w.Len())
	}
	w.Add(now.Add(-time.Nanosecond), 4) // before the wheel's time, now the clock's
	w.Add(now.Add(time.Millisecond), 5)
	if got := w.Advance(now.Add(-time.Minute)); !slices.Equal(got, []int{4}) {
		t.Fatalf("after Reset: Advance = %v, want [4]", got)
	}
	if got := w.Advance(now.Add(2000 * 24 * time.Hour)); !slices.Equal(got, []int{5}) {
		t.Fatalf("after Reset: Advance = %v, want [5]", got)
	}
}

func TestFarFuture(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[int](t, Config{Clock: clk})
	start := clk.Now()
	dues := []time.Duration{31 * 24 * time.Hour, 3 * 365 * 24 * time.Hour, 50 * 365 * 24 * time.Hour, 200 * 365 * 24 * time.Hour}
	for i, d := range dues {
		w.Add(start.Add(d), i)
	}
	for i, d := range dues {
		if got := w.Advance(start.Add(d - time.Nanosecond)); got != nil {
			t.Fatalf("%v: fired %v a nanosecond early", d, got)
		}
		if got := w.Advance(start.Add(d)); !slices.Equal(got, []int{i}) {
			t.Fatalf("%v: Advance = %v, want [%d]", d, got, i)
		}
	}
}

// TestConcurrent runs Add and Cancel on several goroutines while another
// advances the clock; run it with -race. Every timer fires exactly once
// unless its Cancel returned true, and then it never fires.
func TestConcurrent(t *testing.T) {
	clk := newFakeClock()
	w := mustNew[int](t, Config{Tick: time.Millisecond, Slots: 16, Clock: clk})
	const workers, per = 4, 10000
	cancelled := make([][]bool, workers)
	var fired []int
	advances := 0
	var advanced atomic.Int64 // advances, for the workers to wait on
	stop := make(chan struct{})
	advDone := make(chan struct{})
	go func() {
		defer close(advDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			fired = append(fired, w.Advance(clk.Add(time.Duration(rand.IntN(3))*time.Millisecond))...)
			advances++
			advanced.Add(1)
		}
	}()
	var wg sync.WaitGroup
	for g := range workers {
		cancelled[g] = make([]bool, per)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			hs := make([]*Timer[int], 0, per)
			for i := range per {
				if i == per/2 {
					// Halfway, the advancing goroutine must have run while
					// timers are being added: on a loaded machine the
					// scheduler may otherwise run it only before or after
					// the adds (CI once saw 0 timers fire over 107,888
					// advances). Bounded, so a stuck wheel fails below.
					from, until := advanced.Load(), time.Now().Add(10*time.Second)
					for advanced.Load() < from+100 && time.Now().Before(until) {
						runtime.Gosched()
					}
				}
				due := clk.Now().Add(time.Duration(rng.IntN(2000)-50) * time.Millisecond)
				hs = append(hs, w.Add(due, g*per+i))
				if rng.IntN(3) == 0 {
					j := rng.IntN(len(hs))
					if w.Cancel(hs[j]) {
						if cancelled[g][j] {
							t.Errorf("timer %d cancelled twice", g*per+j)
						}
						cancelled[g][j] = true
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-advDone
	t.Logf("%d timers fired over %d advances while being added and cancelled", len(fired), advances)
	if len(fired) == 0 {
		t.Fatal("nothing fired while timers were being added: no concurrency tested")
	}
	fired = append(fired, w.Advance(clk.Add(time.Hour))...)
	seen := make([]int, workers*per)
	for _, id := range fired {
		seen[id]++
	}
	for id, n := range seen {
		if c := cancelled[id/per][id%per]; (c && n != 0) || (!c && n != 1) {
			t.Fatalf("timer %d fired %d times, cancelled %v", id, n, c)
		}
	}
	if w.Len() != 0 {
		t.Fatalf("Len = %d", w.Len())
	}
}

func TestHeap1M(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a million timers")
	}
	perEntry, total := heapOf1M(t)
	t.Logf("%.1f B/entry, %.1f MiB", perEntry, total)
	if total > 64 {
		t.Fatalf("1M timers take %.1f MiB, want under 64", total)
	}
}
