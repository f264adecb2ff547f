package fsm

import (
	"fmt"

	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
)

// ErrKeyNotFound: no message with the idempotency key in the topic's
// dedup window.
var ErrKeyNotFound = refusal.New(404, "key_not_found", "no message with this idempotency key in the topic's dedup window")

// KeyTrace is where the message with an idempotency key is, and its state
// in every group of the topic (SPEC §11).
type KeyTrace struct {
	Key         string
	Partition   uint32
	Offset      uint64
	PublishedAt int64  // unix ms; 0 once retention removed the message
	Duplicates  uint64 // publishes answered as its duplicates (counted from state format 3)
	Groups      map[string]group.KeyState
}

// TraceKey answers the trace of key in topic at now, from the publish
// index, the message's record and each group's indexes: no scan.
func (r *Reader) TraceKey(topic, key string, now int64) (*KeyTrace, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	ix, err := publishIndex(r.tx, l)
	if err != nil {
		return nil, err
	}
	v, ok := ix.Get([]byte(key), now)
	if !ok {
		return nil, fmt.Errorf("%w: %q in topic %q", ErrKeyNotFound, key, topic)
	}
	p, off, dups, err := decodeKeyEntry(v)
	if err != nil {
		return nil, err
	}
	t := &KeyTrace{Key: key, Partition: p, Offset: off, Duplicates: dups, Groups: map[string]group.KeyState{}}
	if part, err := l.Partition(p); err == nil {
		if m, err := part.Get(off); err == nil && m != nil {
			t.PublishedAt = m.PublishedAt
		}
	}
	for _, name := range group.Names(l) {
		g, err := group.Open(r.tx, l, name, false, now)
		if err != nil {
			return nil, err
		}
		if t.Groups[name], err = g.KeyState(key, p, off, now); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Reconciliation is the answer of Reader.Reconcile: the keys never stored
// (or no longer in the dedup window), how many are, and per group the
// stored keys by what became of them.
type Reconciliation struct {
	Missing []string
	Stored  int
	Groups  map[string]*GroupKeys
}

// GroupKeys are a group's keys by state: skipped ones count as acked when
// the group processed the key through another message and as dead when
// the message was dropped unprocessed; delayed ones count as pending.
type GroupKeys struct {
	Acked, Pending, InFlight, Dead []string
}

// Reconcile checks keys against topic at now: for every group, or only
// name when it is not empty (group.ErrGroupNotFound if it does not exist).
func (r *Reader) Reconcile(topic string, keys []string, name string, now int64) (*Reconciliation, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	ix, err := publishIndex(r.tx, l)
	if err != nil {
		return nil, err
	}
	names := group.Names(l)
	if name != "" {
		names = []string{name}
	}
	rec := &Reconciliation{Missing: []string{}, Groups: map[string]*GroupKeys{}}
	gs := make([]*group.Group, len(names))
	for i, n := range names {
		if gs[i], err = group.Open(r.tx, l, n, false, now); err != nil {
			return nil, err
		}
		rec.Groups[n] = &GroupKeys{Acked: []string{}, Pending: []string{}, InFlight: []string{}, Dead: []string{}}
	}
	for _, k := range keys {
		v, ok := ix.Get([]byte(k), now)
		if !ok {
			rec.Missing = append(rec.Missing, k)
			continue
		}
		rec.Stored++
		p, off, err := decodePlacement(v)
		if err != nil {
			return nil, err
		}
		for i, g := range gs {
			ks, err := g.KeyState(k, p, off, now)
			if err != nil {
				return nil, err
			}
			gk := rec.Groups[names[i]]
			switch {
			case ks.Processed:
				gk.Acked = append(gk.Acked, k)
			case ks.State == group.KeyLeased:
				gk.InFlight = append(gk.InFlight, k)
			case ks.State == group.KeyDead || ks.State == group.KeySkipped:
				gk.Dead = append(gk.Dead, k)
			default:
				gk.Pending = append(gk.Pending, k)
			}
		}
	}
	return rec, nil
}
