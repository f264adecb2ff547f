package group

import (
	"github.com/mqd/mqd/dlq"
	mlog "github.com/mqd/mqd/log"
)

// Key states answered by KeyState (SPEC §11).
const (
	KeyPending = "pending" // not delivered yet, due for redelivery, or held behind its key
	KeyLeased  = "leased"  // in flight
	KeyDelayed = "delayed" // waiting for its delay or its retry's backoff
	KeyAcked   = "acked"
	KeyDead    = "dead"    // in the dead-letter store
	KeySkipped = "skipped" // done without this message being acked: its key was processed through another message, or it was trimmed or its dead letter discarded
)

// KeyState is where one message stands in a group.
type KeyState struct {
	State      string
	Deliveries uint64        // deliveries since the last replay (failed ones and the current or acked one)
	History    []dlq.Failure // failed deliveries, oldest first (at most dlq.MaxHistory)
	// Processed: the group acked the key, through this message or (when
	// skipped) another one; a skipped message without it was dropped
	// unprocessed (trimmed before delivery, its dead letter discarded).
	Processed bool
}

// TraceKeys makes acks of keyed messages record with the processed key
// which message it was and how its deliveries went, for KeyState. Like
// UseSpans, every replica must do the same: the node sets it from the
// replicated state format (3).
func (g *Group) TraceKeys() { g.traceKeys = true }

// ackTrace is the processed-key payload of an ack of rec (at r).
func (g *Group) ackTrace(r Receipt, rec record) []byte {
	if !g.traceKeys || rec.Key == "" {
		return nil
	}
	var e mlog.Enc
	e.U64(uint64(r.Partition))
	e.U64(r.Offset)
	e.U64(uint64(rec.RetryCount) + 1)
	dlq.EncodeHistory(&e, rec.History)
	return e.B
}

// KeyState answers the state of the message at (p, off), whose key is
// key, at now: from its record, its cursor, and the processed-key index;
// no scan.
func (g *Group) KeyState(key string, p uint32, off uint64, now int64) (KeyState, error) {
	if p >= g.log.Cfg.Partitions {
		return KeyState{State: KeySkipped}, nil
	}
	rec, ok, err := g.getRecord(p, off)
	if err != nil {
		return KeyState{}, err
	}
	if ok {
		return g.recordState(rec, now)
	}
	next, err := g.cursor(p)
	if err != nil {
		return KeyState{}, err
	}
	if off >= next {
		return KeyState{State: KeyPending}, nil
	}
	ix, err := g.processedIndex()
	if err != nil {
		return KeyState{}, err
	}
	v, ok := ix.Get([]byte(key), now)
	if !ok {
		return KeyState{State: KeySkipped}, nil
	}
	if len(v) == 0 { // acked before state format 3: no details kept
		return KeyState{State: KeyAcked, Deliveries: 1, Processed: true}, nil
	}
	d := mlog.Dec{B: v}
	ap, aoff, n := uint32(d.U64()), d.U64(), d.U64()
	h := dlq.DecodeHistory(&d)
	if err := d.Err(); err != nil {
		return KeyState{}, err
	}
	if ap != p || aoff != off {
		return KeyState{State: KeySkipped, Processed: true}, nil
	}
	return KeyState{State: KeyAcked, Deliveries: n, History: h, Processed: true}, nil
}

func (g *Group) recordState(rec record, now int64) (KeyState, error) {
	ks := KeyState{Deliveries: uint64(rec.RetryCount), History: rec.History}
	switch rec.State {
	case stateLeased:
		ks.State = KeyLeased
		ks.Deliveries++
	case stateReady:
		ks.State = KeyPending
		if rec.Until > now {
			ks.State = KeyDelayed
		}
	case stateHeld:
		ks.State = KeyPending
	case stateDead:
		ks.State = KeyDead
		store, err := g.DeadLetters()
		if err != nil {
			return KeyState{}, err
		}
		if l, err := store.Get(rec.Delivery); err == nil {
			ks.Deliveries, ks.History = uint64(l.RetryCount), l.History
		}
	}
	return ks, nil
}
