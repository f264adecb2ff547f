package delay

import "math/bits"

// Timer is one pending due time and its payload, returned by Wheel.Add and
// cancelled with Wheel.Cancel. Its fields are guarded by the wheel's mutex.
type Timer[T any] struct {
	due        int64 // nanoseconds since the wheel's origin
	prev, next *Timer[T]
	slot       *slot[T] // nil once fired, cancelled or reset
	v          T
}

// slot is an intrusive doubly-linked list of timers, oldest first.
type slot[T any] struct {
	head, tail *Timer[T]
	level      int32 // index in Wheel.levels, or -1 for the overflow list
	index      int32
}

func (s *slot[T]) push(t *Timer[T]) {
	t.slot, t.prev, t.next = s, s.tail, nil
	if s.tail == nil {
		s.head = t
	} else {
		s.tail.next = t
	}
	s.tail = t
}

func (s *slot[T]) remove(t *Timer[T]) {
	if t.prev == nil {
		s.head = t.next
	} else {
		t.prev.next = t.next
	}
	if t.next == nil {
		s.tail = t.prev
	} else {
		t.next.prev = t.prev
	}
	t.prev, t.next, t.slot = nil, nil, nil
}

// take empties the slot and returns its former list, still linked.
func (s *slot[T]) take() *Timer[T] {
	h := s.head
	s.head, s.tail = nil, nil
	return h
}

// level is one wheel: its slots and a bitmap of the non-empty ones, so the
// next non-empty slot is found a word at a time instead of a slot at a time.
type level[T any] struct {
	slots []slot[T]
	bits  []uint64
	shift uint  // log2 of the ticks one slot spans
	mask  int64 // len(slots) - 1
}

func newLevel[T any](idx int, shift, slotBits uint) level[T] {
	n := 1 << slotBits
	l := level[T]{slots: make([]slot[T], n), bits: make([]uint64, (n+63)/64), shift: shift, mask: int64(n - 1)}
	for i := range l.slots {
		l.slots[i].level, l.slots[i].index = int32(idx), int32(i)
	}
	return l
}

// slotOf returns the index of the slot holding tick tk.
func (l *level[T]) slotOf(tk int64) int { return int((tk >> l.shift) & l.mask) }

func (l *level[T]) mark(i int)   { l.bits[i>>6] |= 1 << (i & 63) }
func (l *level[T]) unmark(i int) { l.bits[i>>6] &^= 1 << (i & 63) }

// next returns d such that slot (start+d) mod len(slots) is the first
// non-empty one from start on, going round once; -1 if all are empty.
func (l *level[T]) next(start int) int {
	n, w := len(l.slots), start>>6
	if b := l.bits[w] &^ (1<<(start&63) - 1); b != 0 {
		return w<<6 + bits.TrailingZeros64(b) - start
	}
	for i := 1; i <= len(l.bits); i++ {
		wi := (w + i) % len(l.bits)
		if b := l.bits[wi]; b != 0 {
			return (wi<<6 + bits.TrailingZeros64(b) - start + n) % n
		}
	}
	return -1
}
