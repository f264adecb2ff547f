package delay

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Wheel is a hierarchical timing wheel of payloads of type T. All methods are
// safe for concurrent use.
type Wheel[T any] struct {
	tickNs   int64
	clock    Clock
	origin   time.Time // New's clock reading without its monotonic part
	topShift uint      // log2 of the ticks all levels span together
	levelOf  [65]int8  // by bit length of ticks ahead: level, or len(levels) for overflow
	kick     chan struct{}

	mu       sync.Mutex
	levels   []level[T]
	overflow slot[T]
	cur      int64 // first tick not wholly fired; its cascades are done
	nowNs    int64 // latest time advanced to, since origin; within tick cur
	n        int   // pending timers
	scratch  []*Timer[T]
	wakeNs   int64 // when Run will next advance; math.MinInt64 when Run is not running
}

// New returns an empty wheel whose time is cfg.Clock's now.
func New[T any](cfg Config) (*Wheel[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	w := &Wheel[T]{
		tickNs:   int64(cfg.Tick),
		clock:    cfg.Clock,
		origin:   cfg.Clock.Now().Round(0),
		kick:     make(chan struct{}, 1),
		overflow: slot[T]{level: -1},
		wakeNs:   math.MinInt64,
	}
	for i, b := range cfg.levelBits() {
		w.levels = append(w.levels, newLevel[T](i, w.topShift, b))
		w.topShift += b
	}
	for n := range w.levelOf {
		k := 0
		for k < len(w.levels) && uint(n) > w.levels[k].shift+uint(bits.Len64(uint64(w.levels[k].mask))) {
			k++
		}
		w.levelOf[n] = int8(k)
	}
	return w, nil
}

// Add schedules v to fire at due and returns the handle that cancels it. A
// due time at or before the wheel's time fires at the next Advance.
func (w *Wheel[T]) Add(due time.Time, v T) *Timer[T] {
	t := &Timer[T]{due: int64(due.Sub(w.origin)), v: v}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	tk := w.place(t)
	if wake := w.tickEnd(tk); wake < w.wakeNs {
		w.wakeNs = wake
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return t
}

// Cancel removes t, which must come from this wheel's Add, and reports
// whether t was pending: false if it already fired, was cancelled, or was
// dropped by Reset. A cancelled payload is never returned. (Timer has no
// Cancel method: a wheel pointer in every node would take a small-payload
// node from 48 to 64 bytes.)
func (w *Wheel[T]) Cancel(t *Timer[T]) bool {
	if t == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := t.slot
	if s == nil {
		return false
	}
	s.remove(t)
	if s.head == nil && s.level >= 0 {
		w.levels[s.level].unmark(int(s.index))
	}
	var zero T
	t.v = zero
	w.n--
	return true
}

// Advance moves the wheel's time to now and returns every payload due at or
// before now, in due-time order (ties in no promised order); nil if none.
// The wheel's time never moves back: an earlier now counts as its time.
func (w *Wheel[T]) Advance(now time.Time) []T {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.advance(int64(now.Sub(w.origin)), nil)
}

// Len returns the number of pending timers.
func (w *Wheel[T]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Reset drops every pending timer (Cancel then returns false for them) and
// moves the wheel's time forward to the clock's now, ready to be rebuilt.
func (w *Wheel[T]) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.levels {
		l := &w.levels[k]
		for i := range l.slots {
			w.drop(&l.slots[i])
		}
		clear(l.bits)
	}
	w.drop(&w.overflow)
	w.n = 0
	if now := int64(w.clock.Now().Sub(w.origin)); now > w.nowNs {
		w.nowNs, w.cur = now, now/w.tickNs
	}
	if w.wakeNs != math.MinInt64 {
		w.wakeNs = math.MaxInt64
	}
}

func (w *Wheel[T]) drop(s *slot[T]) {
	var zero T
	for t := s.take(); t != nil; {
		next := t.next
		t.prev, t.next, t.slot, t.v = nil, nil, nil, zero
		t = next
	}
}

// place links t into the slot for its due tick and returns that tick: cur
// if t is already due. A tick ahead by fewer than 2^shift(k+1) ticks goes to
// level k, the lowest whose horizon holds it.
func (w *Wheel[T]) place(t *Timer[T]) int64 {
	tk := w.cur
	if t.due > 0 && t.due/w.tickNs > tk {
		tk = t.due / w.tickNs
	}
	k := int(w.levelOf[bits.Len64(uint64(tk-w.cur))])
	if k == len(w.levels) {
		w.overflow.push(t)
		return tk
	}
	l := &w.levels[k]
	i := l.slotOf(tk)
	l.slots[i].push(t)
	l.mark(i)
	return tk
}

// tickEnd returns the end of tick tk in nanoseconds since origin, saturated.
func (w *Wheel[T]) tickEnd(tk int64) int64 {
	if tk >= math.MaxInt64/w.tickNs-1 {
		return math.MaxInt64
	}
	return (tk + 1) * w.tickNs
}

// advance fires every whole tick before now's, skipping straight from one
// event (a non-empty level-0 slot, a cascade) to the next, then fires what
// is due in now's tick, and appends the payloads to out.
func (w *Wheel[T]) advance(nowNs int64, out []T) []T {
	w.nowNs = max(w.nowNs, nowNs)
	target := w.nowNs / w.tickNs
	l0 := &w.levels[0]
	for w.cur < target {
		out = w.fire(l0.slotOf(w.cur), math.MaxInt64, out)
		next := target
		if w.n > 0 {
			next = min(next, w.nextFire(), w.nextCascade())
		}
		w.cur = next
		w.cascade(next)
	}
	return w.fire(l0.slotOf(w.cur), w.nowNs, out)
}

// nextFire returns the first tick after cur with a non-empty level-0 slot,
// or MaxInt64. It assumes cur's own slot is empty.
func (w *Wheel[T]) nextFire() int64 {
	l0 := &w.levels[0]
	if d := l0.next(l0.slotOf(w.cur + 1)); d >= 0 {
		return w.cur + 1 + int64(d)
	}
	return math.MaxInt64
}

// nextCascade returns the first tick after cur at which a non-empty slot of
// a higher level, or the overflow list, moves down; MaxInt64 if none.
func (w *Wheel[T]) nextCascade() int64 {
	best := int64(math.MaxInt64)
	for k := 1; k < len(w.levels); k++ {
		l := &w.levels[k]
		c := w.cur >> l.shift
		if d := l.next(l.slotOf((c + 1) << l.shift)); d >= 0 {
			best = min(best, (c+1+int64(d))<<l.shift)
		}
	}
	if w.overflow.head != nil {
		best = min(best, (w.cur>>w.topShift+1)<<w.topShift)
	}
	return best
}

// cascade moves down the slots whose span starts at tick tk: at a
// multiple of 2^shift(k), level k's slot for tk. Their timers are due within
// that span, so each lands on a lower level, never on a slot cascading now.
func (w *Wheel[T]) cascade(tk int64) {
	for k := 1; k < len(w.levels); k++ {
		l := &w.levels[k]
		if tk&(1<<l.shift-1) != 0 {
			return
		}
		if i := l.slotOf(tk); l.slots[i].head != nil {
			l.unmark(i)
			w.replace(&l.slots[i])
		}
	}
	if tk&(1<<w.topShift-1) == 0 && w.overflow.head != nil {
		w.replace(&w.overflow)
	}
}

func (w *Wheel[T]) replace(s *slot[T]) {
	for t := s.take(); t != nil; {
		next := t.next
		w.place(t)
		t = next
	}
}

// fire unlinks the timers of level-0 slot i due at or before dueNs and
// appends their payloads to out, sorted by due time.
func (w *Wheel[T]) fire(i int, dueNs int64, out []T) []T {
	l0 := &w.levels[0]
	s := &l0.slots[i]
	if s.head == nil {
		return out
	}
	sc := w.scratch[:0]
	for t := s.head; t != nil; {
		next := t.next
		if t.due <= dueNs {
			s.remove(t)
			sc = append(sc, t)
		}
		t = next
	}
	if s.head == nil {
		l0.unmark(i)
	}
	byDue := func(a, b *Timer[T]) int { return cmp.Compare(a.due, b.due) }
	if !slices.IsSortedFunc(sc, byDue) {
		slices.SortStableFunc(sc, byDue)
	}
	var zero T
	for _, t := range sc {
		out = append(out, t.v)
		t.v = zero
	}
	w.n -= len(sc)
	clear(sc)
	if cap(sc) <= 1<<16 {
		w.scratch = sc[:0]
	} else {
		w.scratch = nil
	}
	return out
}
