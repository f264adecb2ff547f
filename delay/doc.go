// Package delay is a hierarchical timing wheel: an in-memory index of due
// times for the leader's soft state (lease expiries, retry back-offs,
// delayed messages), built to hold millions of entries.
//
// Insert and cancel are O(1): every pending entry is one small node on an
// intrusive doubly-linked list in one slot. Level 0 has one slot per tick;
// each slot of a higher level spans the whole level below it, and entries due
// beyond the top level wait on an overflow list that is re-examined each time
// the top level wraps, so any due time works. As time advances, entries
// cascade down one level at a time until they reach level 0 and fire. Time
// never moves on its own: Advance moves it to a given instant, and Run (one
// goroutine, one armed timer) calls Advance when the next non-empty slot is
// due. Tests inject a Clock and call Advance instead of sleeping.
//
// Time is wall-clock time, because the due times it holds come from durable
// state stamped by the leader. A wall clock stepping backwards delays firing
// by the step; the wheel never moves its own time backwards.
//
// It is not durable and not replicated: it is an index rebuilt from durable
// state on start and on leadership change (see Wheel.Reset). It does not
// decide what firing means, call back per entry, or run the callback on a
// goroutine of its own; Run hands each batch to one function, in order. Its
// resolution is one tick: Advance is exact, but Run fires an entry up to one
// tick (plus scheduling delay) after it is due.
package delay
