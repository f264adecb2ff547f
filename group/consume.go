package group

import (
	"bytes"
	"encoding/binary"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Delivery is one message leased to a consumer.
type Delivery struct {
	Partition  uint32
	Offset     uint64
	RetryCount uint32
	Delivery   uint64
}

// Lease hands out up to max deliverable messages, each leased until
// now+leaseMs under delivery id idx (the Raft index of the command).
// Messages due for redelivery come first, oldest due first; then new
// messages, one partition after another starting at idx mod partitions.
func (g *Group) Lease(now, leaseMs int64, max int, idx uint64) ([]Delivery, error) {
	var out []Delivery
	until := now + leaseMs
	// Redeliveries that are due.
	c := g.b.Bucket(bktReady).Cursor()
	var due [][]byte
	for k, _ := c.First(); k != nil && len(due) < max; k, _ = c.Next() {
		if int64(binary.BigEndian.Uint64(k)) > now {
			break
		}
		due = append(due, bytes.Clone(k))
	}
	for _, k := range due {
		p, off := binary.BigEndian.Uint32(k[8:]), binary.BigEndian.Uint64(k[12:])
		r, ok, err := g.getRecord(p, off)
		if err != nil {
			return nil, err
		}
		if !ok || r.State != stateReady {
			return nil, errCorruptIndex(p, off)
		}
		nr := record{State: stateLeased, RetryCount: r.RetryCount, Delivery: idx, Until: until}
		if err := g.replace(p, off, r, nr); err != nil {
			return nil, err
		}
		out = append(out, Delivery{p, off, r.RetryCount, idx})
	}
	// New messages, round robin over partitions.
	n := g.log.Cfg.Partitions
	type pc struct{ next, end uint64 }
	cur := make([]pc, n)
	for i := uint32(0); i < n; i++ {
		next, err := g.cursor(i)
		if err != nil {
			return nil, err
		}
		part, _ := g.log.Partition(i)
		cur[i] = pc{next, part.Meta.Next}
	}
	start := uint32(idx % uint64(n))
	for len(out) < max {
		progressed := false
		for j := uint32(0); j < n && len(out) < max; j++ {
			p := (start + j) % n
			if cur[p].next >= cur[p].end {
				continue
			}
			off := cur[p].next
			cur[p].next++
			progressed = true
			if err := g.putRecord(p, off, record{State: stateLeased, Delivery: idx, Until: until}); err != nil {
				return nil, err
			}
			out = append(out, Delivery{p, off, 0, idx})
		}
		if !progressed {
			break
		}
	}
	for i := uint32(0); i < n; i++ {
		if old, _ := g.cursor(i); cur[i].next != old {
			if err := g.setCursor(i, cur[i].next); err != nil {
				return nil, err
			}
		}
	}
	if len(out) > 0 {
		g.dirty = true
	}
	return out, g.Save()
}

// Receipt statuses.
const (
	StatusOK      = "ok"
	StatusStale   = "stale"
	StatusInvalid = "invalid"
)

// check classifies a receipt against the group's state at time now.
func (g *Group) check(now int64, r Receipt, appliedIdx uint64) (record, string, error) {
	if r.Delivery > appliedIdx || r.Partition >= g.log.Cfg.Partitions {
		return record{}, StatusInvalid, nil
	}
	next, err := g.cursor(r.Partition)
	if err != nil {
		return record{}, "", err
	}
	if r.Offset >= next {
		part, err := g.log.Partition(r.Partition)
		if err != nil {
			return record{}, "", err
		}
		if r.Offset >= part.Meta.Next {
			return record{}, StatusInvalid, nil
		}
	}
	rec, ok, err := g.getRecord(r.Partition, r.Offset)
	if err != nil {
		return record{}, "", err
	}
	if !ok || rec.State != stateLeased || rec.Delivery != r.Delivery || rec.Until <= now {
		return record{}, StatusStale, nil
	}
	return rec, StatusOK, nil
}

// Ack completes the leased messages; idx is the acking command's index.
func (g *Group) Ack(now int64, idx uint64, receipts []Receipt) ([]string, error) {
	out := make([]string, len(receipts))
	for i, r := range receipts {
		rec, st, err := g.check(now, r, idx)
		if err != nil {
			return nil, err
		}
		if st == StatusOK {
			if err := g.remove(r.Partition, r.Offset, rec); err != nil {
				return nil, err
			}
			g.c.Acked++
		}
		out[i] = st
	}
	return out, g.Save()
}

// Extend moves the lease of each receipt to now+leaseMs.
func (g *Group) Extend(now, leaseMs int64, idx uint64, receipts []Receipt) ([]string, error) {
	out := make([]string, len(receipts))
	for i, r := range receipts {
		rec, st, err := g.check(now, r, idx)
		if err != nil {
			return nil, err
		}
		if st == StatusOK {
			nr := rec
			nr.Until = now + leaseMs
			if err := g.replace(r.Partition, r.Offset, rec, nr); err != nil {
				return nil, err
			}
		}
		out[i] = st
	}
	return out, g.Save()
}

// Release makes leased messages deliverable again at due (a retryable
// failure: lease expiry or nack), counting one more retry.
func (g *Group) Release(now, due int64, idx uint64, receipts []Receipt) ([]string, error) {
	out := make([]string, len(receipts))
	for i, r := range receipts {
		rec, st, err := g.check(now, r, idx)
		if err != nil {
			return nil, err
		}
		if st == StatusOK {
			nr := record{State: stateReady, RetryCount: rec.RetryCount + 1, Until: due}
			if err := g.replace(r.Partition, r.Offset, rec, nr); err != nil {
				return nil, err
			}
		}
		out[i] = st
	}
	return out, g.Save()
}

// Expired is a lease whose expiry has passed, found by DueLeases.
type Expired struct {
	Topic, Group string
	Receipt
}

// ExpireLease makes an expired lease deliverable again (retry_count + 1).
// A lease that was acked, extended or re-leased since is left alone.
func (g *Group) ExpireLease(now int64, r Receipt) error {
	rec, ok, err := g.getRecord(r.Partition, r.Offset)
	if err != nil || !ok || rec.State != stateLeased || rec.Delivery != r.Delivery || rec.Until > now {
		return err
	}
	return g.replace(r.Partition, r.Offset, rec, record{State: stateReady, RetryCount: rec.RetryCount + 1, Until: now})
}

// DueLeases lists up to limit leases, over all groups, whose expiry is at
// or before now, oldest first.
func DueLeases(tx *bolt.Tx, now int64, limit int) ([]Expired, error) {
	var out []Expired
	c := tx.Bucket(bktExpiry).Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if int64(binary.BigEndian.Uint64(k)) > now {
			break
		}
		names := k[20:]
		i := bytes.IndexByte(names, 0)
		if i < 0 {
			return nil, errCorruptIndex(0, 0)
		}
		e := Expired{Topic: string(names[:i]), Group: string(names[i+1:])}
		e.Partition, e.Offset = binary.BigEndian.Uint32(k[8:]), binary.BigEndian.Uint64(k[12:])
		out = append(out, e)
	}
	// Fill in the delivery ids from the records.
	for i := range out {
		e := &out[i]
		l, err := mlog.Open(tx, e.Topic)
		if err != nil {
			return nil, err
		}
		g, err := Open(tx, l, e.Group, false, 0)
		if err != nil {
			return nil, err
		}
		rec, _, err := g.getRecord(e.Partition, e.Offset)
		if err != nil {
			return nil, err
		}
		e.Delivery = rec.Delivery
	}
	return out, nil
}

// Deliverable reports whether a fetch at now would find a message: one due
// for redelivery or one past the cursor. A missing group starts at the head.
func Deliverable(tx *bolt.Tx, topic, name string, now int64) (bool, error) {
	l, err := mlog.Open(tx, topic)
	if err != nil {
		return false, err
	}
	g, err := Open(tx, l, name, false, now)
	if err != nil {
		parts, err := mlog.Partitions(tx, topic)
		if err != nil {
			return false, err
		}
		for _, p := range parts {
			if p.Count() > 0 {
				return true, nil
			}
		}
		return false, nil
	}
	if k, _ := g.b.Bucket(bktReady).Cursor().First(); k != nil && int64(binary.BigEndian.Uint64(k)) <= now {
		return true, nil
	}
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		next, err := g.cursor(i)
		if err != nil {
			return false, err
		}
		part, _ := l.Partition(i)
		if next < part.Meta.Next {
			return true, nil
		}
	}
	return false, nil
}

// Stats are a group's live figures.
type Stats struct {
	Backlog           uint64 `json:"backlog"`
	InFlight          uint64 `json:"in_flight"`
	Delayed           uint64 `json:"delayed"`
	DLQ               uint64 `json:"dlq"`
	Acked             uint64 `json:"acked"`
	DuplicatesSkipped uint64 `json:"duplicates_skipped"`
}

// Stats computes the group's figures at time now.
func (g *Group) Stats(now int64) (Stats, error) {
	s := Stats{InFlight: g.c.InFlight, Acked: g.c.Acked, DuplicatesSkipped: g.c.DupSkipped}
	for i := uint32(0); i < g.log.Cfg.Partitions; i++ {
		next, err := g.cursor(i)
		if err != nil {
			return s, err
		}
		part, _ := g.log.Partition(i)
		s.Backlog += part.Meta.Next - next
	}
	// Ready records due in the future are delayed; the rest are backlog.
	c := g.b.Bucket(bktReady).Cursor()
	var dueNow uint64
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if int64(binary.BigEndian.Uint64(k)) > now {
			break
		}
		dueNow++
	}
	s.Backlog += dueNow
	s.Delayed = g.c.Ready - dueNow
	return s, nil
}
