package group

import (
	"bytes"
	"encoding/binary"
	"errors"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Delivery is one message leased to a consumer.
type Delivery struct {
	Partition  uint32
	Offset     uint64
	RetryCount uint32
	Delivery   uint64
	Reason     string // the latest failure's reason, for reject_reason
	// Msg is the message, copied out of the transaction, when the lease
	// was asked for messages (nil otherwise), its MaxRetry resolved
	// against the topic's: the leader answers a fetch from the read that
	// chose it.
	Msg *mlog.Message
}

// maxScan bounds how many messages one lease may pass over (delayed, held
// or skipped) so that a command's work stays small.
const maxScan = 4096

// Lease hands out up to max deliverable messages, each leased until
// now+leaseMs under delivery id idx (the Raft index of the command).
// Messages due for redelivery come first, oldest due first; then new
// messages, one partition after another starting at idx mod partitions
// (with RotatePartitions: after the last partition the group's previous
// lease took one from).
// On the way, consumer-group idempotency applies (see offer). With msgs
// set, each delivery carries its message (Delivery.Msg): the node whose
// client waits for the answer asks for them, the others need not.
func (g *Group) Lease(now, leaseMs int64, max int, idx uint64, msgs bool) ([]Delivery, error) {
	lz := &leaser{g: g, now: now, until: now + leaseMs, idx: idx, max: max, maxBytes: g.leaseBytes, msgs: msgs}
	if err := lz.dueRedeliveries(); err != nil {
		return nil, err
	}
	if err := lz.newMessages(); err != nil {
		return nil, err
	}
	if len(lz.out) > 0 || lz.scanned > 0 {
		g.dirty = true
	}
	return lz.out, g.Save()
}

type leaser struct {
	g          *Group
	now, until int64
	idx        uint64
	max        int
	maxBytes   int  // stop once the leased messages' records hold this many bytes (0: no bound)
	bytes      int  // the leased messages' record bytes so far
	msgs       bool // read each candidate whole and hand the leased ones out
	scanned    int
	out        []Delivery
	spans      map[uint32]*span // with g.spans: this lease's span per partition
	scans      map[uint32]*mlog.Scanner
}

func (lz *leaser) full() bool {
	return len(lz.out) >= lz.max || lz.scanned >= maxScan || (lz.maxBytes > 0 && lz.bytes >= lz.maxBytes)
}

func (lz *leaser) dueRedeliveries() error {
	g := lz.g
	c := g.b.Bucket(bktReady).Cursor()
	var due [][]byte
	for k, _ := c.First(); k != nil && len(due) < lz.max; k, _ = c.Next() {
		if int64(binary.BigEndian.Uint64(k)) > lz.now {
			break
		}
		due = append(due, bytes.Clone(k))
	}
	for _, k := range due {
		if lz.full() {
			return nil
		}
		p, off := binary.BigEndian.Uint32(k[8:]), binary.BigEndian.Uint64(k[12:])
		r, ok, err := g.getRecord(p, off)
		if err != nil {
			return err
		}
		if !ok || r.State != stateReady {
			return errCorruptIndex(p, off)
		}
		if err := lz.offer(p, off, &r); err != nil {
			return err
		}
	}
	return nil
}

// newMessages walks the cursors round robin over partitions.
func (lz *leaser) newMessages() error {
	g := lz.g
	n := g.log.Cfg.Partitions
	next := make([]uint64, n)
	end := make([]uint64, n)
	for i := uint32(0); i < n; i++ {
		var err error
		if next[i], err = g.cursor(i); err != nil {
			return err
		}
		part, _ := g.log.Partition(i)
		end[i] = part.Meta.Next
	}
	moved := make([]bool, n)
	start := uint32(lz.idx % uint64(n))
	if g.rotate {
		start = g.nextPartition() % n
	}
	last := -1 // the partition of the last message taken
	for !lz.full() {
		progressed := false
		for j := uint32(0); j < n && !lz.full(); j++ {
			p := (start + j) % n
			if next[p] >= end[p] {
				continue
			}
			off := next[p]
			next[p]++
			moved[p], progressed, last = true, true, int(p)
			if err := lz.offer(p, off, nil); err != nil {
				return err
			}
		}
		if !progressed {
			break
		}
	}
	for i := uint32(0); i < n; i++ {
		if moved[i] {
			if err := g.setCursor(i, next[i]); err != nil {
				return err
			}
		}
	}
	if g.rotate && last >= 0 {
		return g.setNextPartition((uint32(last) + 1) % n)
	}
	return nil
}

// nextPartition is where the group's next lease starts taking new
// messages (0 before its first).
func (g *Group) nextPartition() uint32 {
	if v := g.b.Get(keyNextPartition); len(v) == 4 {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (g *Group) setNextPartition(p uint32) error {
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], p)
	return g.b.Put(keyNextPartition, v[:])
}

// offer decides what happens to one candidate message: old is its record
// when it is waiting for redelivery, nil when it is new. A new message
// that is delayed waits in the ready index; a message whose key the group
// has processed is skipped (the broker acks it); a message whose key is
// leased by another message is held; anything else is leased.
func (lz *leaser) offer(p uint32, off uint64, old *record) error {
	g := lz.g
	lz.scanned++
	part, err := g.log.Partition(p)
	if err != nil {
		return err
	}
	sc := lz.scanner(part)
	deliverAt, key, ok, m, err := lz.read(sc, off)
	if err != nil {
		return err
	}
	size := sc.LastSize() // the record's bytes: the same on every replica, messages read whole or not
	set := func(r record) error {
		if old != nil {
			return g.replace(p, off, *old, r)
		}
		return g.putRecord(p, off, r)
	}
	// A redelivery keeps its retry count, last reason and history.
	var carry record
	if old != nil {
		carry = record{RetryCount: old.RetryCount, Reason: old.Reason, History: old.History}
	}
	retry := carry.RetryCount
	switch {
	case !ok: // trimmed meanwhile
		if old != nil {
			return g.remove(p, off, *old)
		}
		return nil
	case old == nil && deliverAt > lz.now:
		return set(record{State: stateReady, Until: deliverAt, Key: key})
	case key != "" && g.processed(key, lz.now):
		g.c.DupSkipped++
		if old != nil {
			return g.remove(p, off, *old)
		}
		return nil
	case key != "" && g.leasedByOther(key, p, off):
		return set(record{State: stateHeld, RetryCount: retry, Key: key, Reason: carry.Reason, History: carry.History})
	}
	if g.spans && old == nil && key == "" {
		lz.leaseInSpan(p, off)
	} else if err := set(record{State: stateLeased, RetryCount: retry, Delivery: lz.idx, Until: lz.until, Key: key,
		Reason: carry.Reason, History: carry.History}); err != nil {
		return err
	}
	d := Delivery{Partition: p, Offset: off, RetryCount: retry, Delivery: lz.idx, Reason: carry.Reason}
	if m != nil {
		d.Msg = m.Clone() // m aliases the transaction's memory
		if d.Msg.MaxRetry < 0 {
			d.Msg.MaxRetry = g.log.Cfg.MaxRetry // the topic's, as the failure will apply it
		}
	}
	lz.out = append(lz.out, d)
	lz.bytes += size
	return nil
}

// scanner returns the lease's scanner of part: new messages are read in
// rising offsets per partition (a redelivery's offset is a seek), and the
// lease writes no message.
func (lz *leaser) scanner(part *mlog.Partition) *mlog.Scanner {
	if lz.scans == nil {
		lz.scans = map[uint32]*mlog.Scanner{}
	}
	sc := lz.scans[part.ID]
	if sc == nil {
		sc = part.Scanner()
		lz.scans[part.ID] = sc
	}
	return sc
}

// read reads what offer needs of the message at off: only its head, or
// with lz.msgs the whole message (m, aliasing the transaction's memory).
func (lz *leaser) read(sc *mlog.Scanner, off uint64) (deliverAt int64, key string, ok bool, m *mlog.Message, err error) {
	if !lz.msgs {
		deliverAt, key, ok, err = sc.Head(off)
		return deliverAt, key, ok, nil, err
	}
	if m, err = sc.Get(off); err != nil || m == nil {
		return 0, "", false, nil, err
	}
	return m.DeliverAt, m.IdempotencyKey, true, m, nil
}

// Receipt statuses.
const (
	StatusOK      = "ok"
	StatusStale   = "stale"
	StatusInvalid = "invalid"
)

// check classifies a receipt against the group's state at time now.
// A receipt names the lease of an earlier entry: leases share entries with
// acks, extends and nacks (group commit), and a receipt naming the entry
// that carries it was never handed out when it was sent.
func (g *Group) check(now int64, r Receipt, idx uint64) (record, string, error) {
	if r.Delivery >= idx || r.Partition >= g.log.Cfg.Partitions {
		return record{}, StatusInvalid, nil
	}
	next, err := g.cursor(r.Partition)
	if err != nil {
		return record{}, "", err
	}
	if r.Offset >= next { // never delivered to this group
		return record{}, StatusInvalid, nil
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

// eachLease classifies every receipt at now and calls fn for those whose
// lease is valid; it answers the statuses in order and saves the counters.
func (g *Group) eachLease(now int64, idx uint64, receipts []Receipt, fn func(i int, r Receipt, rec record) error) ([]string, error) {
	out := make([]string, len(receipts))
	for i, r := range receipts {
		rec, st, err := g.check(now, r, idx)
		if err != nil {
			return nil, err
		}
		if st == StatusOK {
			if err := fn(i, r, rec); err != nil {
				return nil, err
			}
		}
		out[i] = st
	}
	return out, g.Save()
}

// Ack completes the leased messages; idx is the acking command's index.
func (g *Group) Ack(now int64, idx uint64, receipts []Receipt) ([]string, error) {
	return g.eachLease(now, idx, receipts, func(_ int, r Receipt, rec record) error {
		if err := g.remove(r.Partition, r.Offset, rec); err != nil {
			return err
		}
		g.c.Acked++
		return g.keyDone(rec.Key, now, g.ackTrace(r, rec))
	})
}

// Extend moves the lease of each receipt to now+leaseMs.
func (g *Group) Extend(now, leaseMs int64, idx uint64, receipts []Receipt) ([]string, error) {
	return g.eachLease(now, idx, receipts, func(_ int, r Receipt, rec record) error {
		nr := rec
		nr.Until = now + leaseMs
		return g.replace(r.Partition, r.Offset, rec, nr)
	})
}

// Expired is a lease whose expiry has passed, found by DueLeases.
type Expired struct {
	Topic, Group string
	Receipt
}

// DueLeases lists up to limit leases, over all groups, whose expiry is at
// or before now, oldest first (a span's leases in offset order).
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
		topic, name := string(names[:i]), names[i+1:]
		isSpan := len(name) > 0 && name[len(name)-1] == 0
		if isSpan {
			name = name[:len(name)-1]
		}
		l, err := mlog.Open(tx, topic)
		if err != nil {
			return nil, err
		}
		g, err := Open(tx, l, string(name), false, 0)
		if err != nil {
			return nil, err
		}
		p, off := binary.BigEndian.Uint32(k[8:]), binary.BigEndian.Uint64(k[12:])
		if isSpan {
			if out, err = g.dueSpan(p, off, out, limit); err != nil {
				return nil, err
			}
			continue
		}
		rec, _, err := g.getRecord(p, off)
		if err != nil {
			return nil, err
		}
		out = append(out, Expired{Topic: topic, Group: g.Name, Receipt: Receipt{Partition: p, Offset: off, Delivery: rec.Delivery}})
	}
	return out, nil
}

// NeedsLease reports whether a fetch at now must propose a lease command:
// a message is due for redelivery or past the cursor, or the group does not
// exist yet. A first fetch creates its group even when it finds nothing
// (retention keeps messages until every group has acked them, so a group
// that exists only in a consumer's mind would lose what others ack).
func NeedsLease(tx *bolt.Tx, topic, name string, now int64) (bool, error) {
	l, err := mlog.Open(tx, topic)
	if err != nil {
		return false, err
	}
	g, err := Open(tx, l, name, false, now)
	if errors.Is(err, ErrGroupNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
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

// NextDue answers the earliest due time of the group's waiting messages
// (retries, delayed messages, replays), if it has any: a follower parks a
// long-poll until then, since the leader's timing wheel wakes only the
// leader's polls.
func NextDue(tx *bolt.Tx, topic, name string, now int64) (int64, bool, error) {
	l, err := mlog.Open(tx, topic)
	if err != nil {
		return 0, false, err
	}
	g, err := Open(tx, l, name, false, now)
	if err != nil {
		return 0, false, err
	}
	k, _ := g.b.Bucket(bktReady).Cursor().First()
	if k == nil {
		return 0, false, nil
	}
	return int64(binary.BigEndian.Uint64(k)), true, nil
}

// Stats are a group's live figures.
type Stats struct {
	Backlog           uint64 `json:"backlog"`
	InFlight          uint64 `json:"in_flight"`
	Delayed           uint64 `json:"delayed"`
	DLQ               uint64 `json:"dlq"`
	Acked             uint64 `json:"acked"`
	DuplicatesSkipped uint64 `json:"duplicates_skipped"`
	ReplayPending     uint64 `json:"replay_pending"`
}

// Gauges are the figures of a group that its running counters give
// without reading any message, for /metrics: Waiting counts every message
// not yet delivered or waiting for redelivery, whether or not its due
// time has passed (Stats splits that into backlog and delayed, which takes
// a scan of the due ones).
type Gauges struct {
	Waiting, InFlight, DLQ, Acked, DuplicatesSkipped uint64
}

// Gauges reads the group's counters and cursors: O(partitions).
func (g *Group) Gauges() (Gauges, error) {
	s := Gauges{InFlight: g.c.InFlight, Acked: g.c.Acked, DuplicatesSkipped: g.c.DupSkipped, Waiting: g.c.Ready + g.c.Held}
	if store, err := g.DeadLetters(); err == nil {
		s.DLQ = store.Count()
	}
	for i := uint32(0); i < g.log.Cfg.Partitions; i++ {
		next, err := g.cursor(i)
		if err != nil {
			return s, err
		}
		part, _ := g.log.Partition(i)
		s.Waiting += part.Meta.Next - next
	}
	return s, nil
}

// Stats computes the group's figures at time now.
func (g *Group) Stats(now int64) (Stats, error) {
	s := Stats{InFlight: g.c.InFlight, Acked: g.c.Acked, DuplicatesSkipped: g.c.DupSkipped}
	if store, err := g.DeadLetters(); err == nil {
		s.DLQ, s.ReplayPending = store.Count(), store.ReplayPending()
	}
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
	s.Backlog += dueNow + g.c.Held
	s.Delayed = g.c.Ready - dueNow
	return s, nil
}

// ForEachTimer calls fn with every pending due time after now: every
// lease's expiry, and every waiting message's due time in every group. The
// leader rebuilds its timing wheel from it.
func ForEachTimer(tx *bolt.Tx, now int64, fn func(Timer)) error {
	c := tx.Bucket(bktExpiry).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		names := k[20:]
		i := bytes.IndexByte(names, 0)
		if i < 0 {
			return errCorruptIndex(0, 0)
		}
		fn(Timer{Lease: true, Topic: string(names[:i]), At: int64(binary.BigEndian.Uint64(k))})
	}
	for _, t := range mlog.Topics(tx) {
		l, err := mlog.Open(tx, t)
		if err != nil {
			return err
		}
		for _, name := range Names(l) {
			g, err := Open(tx, l, name, false, now)
			if err != nil {
				return err
			}
			rc := g.b.Bucket(bktReady).Cursor()
			for k, _ := rc.Seek(mlog.U64Key(uint64(now + 1))); k != nil; k, _ = rc.Next() {
				fn(Timer{Topic: t, At: int64(binary.BigEndian.Uint64(k))})
			}
		}
	}
	return nil
}
