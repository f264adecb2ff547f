package group

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Sentinel errors.
var (
	ErrGroupNotFound = refusal.New(404, "group_not_found", "group not found")
)

// Message states.
const (
	stateLeased byte = 1 // in flight until Until
	stateReady  byte = 2 // deliverable again from Until
	stateHeld   byte = 3 // waiting while another message with its key is leased
	stateDead   byte = 4 // in the dead-letter store (keeps retention from trimming it)
)

type record struct {
	State      byte
	RetryCount uint32
	Delivery   uint64 // raft index of the lease that delivered it
	Until      int64  // leased: lease expiry; ready: due time (unix ms)
	Key        string // the message's idempotency key
	Reason     string // the latest failure's reason
	History    []dlq.Failure
	span       bool // leased under a span (span.go), not a record of its own; not encoded
}

func (r record) encode() []byte {
	var e mlog.Enc
	e.Byte(r.State)
	e.U64(uint64(r.RetryCount))
	e.U64(r.Delivery)
	e.I64(r.Until)
	e.Str(r.Key)
	e.Str(r.Reason)
	dlq.EncodeHistory(&e, r.History)
	return e.B
}

func decodeRecord(b []byte) (record, error) {
	d := mlog.Dec{B: b}
	r := record{State: d.Byte(), RetryCount: uint32(d.U64()), Delivery: d.U64(), Until: d.I64(), Key: d.Str(), Reason: d.Str()}
	r.History = dlq.DecodeHistory(&d)
	return r, d.Err()
}

// counters are a group's running totals.
type counters struct {
	Acked, DupSkipped, InFlight, Ready, Held uint64
	Created                                  int64
}

func (c counters) encode() []byte {
	var e mlog.Enc
	for _, v := range []uint64{c.Acked, c.DupSkipped, c.InFlight, c.Ready, c.Held} {
		e.U64(v)
	}
	e.I64(c.Created)
	return e.B
}

func decodeCounters(b []byte) (counters, error) {
	d := mlog.Dec{B: b}
	c := counters{Acked: d.U64(), DupSkipped: d.U64(), InFlight: d.U64(), Ready: d.U64(), Held: d.U64(), Created: d.I64()}
	return c, d.Err()
}

var (
	keyCounters = []byte("meta")
	// keyNextPartition: the partition the group's next lease starts
	// taking new messages from (with RotatePartitions; 4 bytes).
	keyNextPartition = []byte("next_partition")
	bktCursor        = []byte("c")
	bktState         = []byte("s")
	bktReady         = []byte("r")
	bktLeasedBy      = []byte("lk")   // idempotency key → the leased message holding it
	bktHeld          = []byte("h")    // key-prefixed index of held messages
	bktDone          = []byte("done") // processed keys (package dedup's index)
	// bktExpiry is a root bucket: every lease in every group by expiry time,
	// so the leader's sweeper finds expired leases with one seek.
	bktExpiry = []byte("lease_expiry")
)

// Init creates the package's root buckets.
func Init(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bktExpiry)
	return err
}

func stateKey(p uint32, off uint64) []byte {
	k := make([]byte, 12)
	binary.BigEndian.PutUint32(k, p)
	binary.BigEndian.PutUint64(k[4:], off)
	return k
}

func timedKey(t int64, p uint32, off uint64) []byte {
	k := make([]byte, 20)
	binary.BigEndian.PutUint64(k, uint64(t))
	binary.BigEndian.PutUint32(k[8:], p)
	binary.BigEndian.PutUint64(k[12:], off)
	return k
}

func expiryKey(t int64, p uint32, off uint64, topic, group string) []byte {
	k := timedKey(t, p, off)
	k = append(k, topic...)
	k = append(k, 0)
	return append(k, group...)
}

// Group is one consumer group of one topic, open in a transaction.
type Group struct {
	Name   string
	timers *[]Timer
	tally  TallySink
	log    *mlog.Log
	b      *bolt.Bucket
	tx     *bolt.Tx
	c      counters
	dirty  bool
	// spans: leases of new keyless messages are recorded per delivery
	// range (span.go) rather than one record per message.
	spans     bool
	spanCache []*span // spans loaded or created in this transaction
	// leaseBytes: a lease stops once its messages' records hold this many
	// bytes (0: no bound).
	leaseBytes int
	// rotate: a lease starts its walk over new messages at the group's
	// stored next partition (keyNextPartition), not at its raft index
	// mod partitions.
	rotate bool
	// traceKeys: an ack of a keyed message records which message it was
	// and its deliveries with the processed key (trace.go).
	traceKeys bool
}

// RotatePartitions makes the group's leases take new messages round robin
// over partitions across leases: each starts at the partition after the
// last one the previous lease took a new message from, a position kept in
// the group's state. (Without it a lease starts at its raft index mod
// partitions, and a consumer whose fetches alternate with its acks sees
// indexes of one parity: with two partitions, it drained partition 0
// first.) Like UseSpans, the node sets it from the replicated state
// format: every replica must choose the same messages.
func (g *Group) RotatePartitions() { g.rotate = true }

// UseSpans makes the group's leases of new keyless messages write one
// range record per partition and lease instead of one record per message.
// The node calls it once every member of the cluster reads range records
// (the replicated state format; an older binary would read them as acked).
func (g *Group) UseSpans() { g.spans = true }

// LimitLeaseBytes makes a lease stop adding messages once the records of
// those it leased hold n bytes or more; the first message is leased
// whatever its size. Like UseSpans, every replica must apply the same
// bound, so the node sets it from the replicated state format.
func (g *Group) LimitLeaseBytes(n int) { g.leaseBytes = n }

// Open returns a group, creating it (cursors at each partition's head) when
// create is set; otherwise a missing group is ErrGroupNotFound.
func Open(tx *bolt.Tx, l *mlog.Log, name string, create bool, now int64) (*Group, error) {
	gs := l.Bucket().Bucket(mlog.BucketGroups)
	b := gs.Bucket([]byte(name))
	if b == nil {
		if !create {
			return nil, fmt.Errorf("%w: %q", ErrGroupNotFound, name)
		}
		if !mlog.ValidName(name) {
			return nil, fmt.Errorf("%w: %q", mlog.ErrInvalidName, name)
		}
		var err error
		if b, err = gs.CreateBucket([]byte(name)); err != nil {
			return nil, fmt.Errorf("create group: %w", err)
		}
		for _, n := range [][]byte{bktCursor, bktState, bktReady, bktLeasedBy, bktHeld} {
			if _, err := b.CreateBucket(n); err != nil {
				return nil, err
			}
		}
		g := &Group{Name: name, log: l, b: b, tx: tx, c: counters{Created: now}, dirty: true}
		return g, g.Save()
	}
	c, err := decodeCounters(b.Get(keyCounters))
	if err != nil {
		return nil, err
	}
	return &Group{Name: name, log: l, b: b, tx: tx, c: c}, nil
}

// Names lists a topic's groups.
func Names(l *mlog.Log) []string {
	var out []string
	_ = l.Bucket().Bucket(mlog.BucketGroups).ForEachBucket(func(k []byte) error {
		out = append(out, string(k))
		return nil
	})
	return out
}

// Delete removes a group and its leases.
func Delete(tx *bolt.Tx, l *mlog.Log, name string) error {
	g, err := Open(tx, l, name, false, 0)
	if err != nil {
		return err
	}
	if err := g.forEachRecord(func(p uint32, off uint64, r record) error {
		return g.dropIndex(p, off, r)
	}); err != nil {
		return err
	}
	if err := g.dropSpanExpiries(); err != nil {
		return err
	}
	return l.Bucket().Bucket(mlog.BucketGroups).DeleteBucket([]byte(name))
}

// DropTopicLeases removes the expiry-index entries of every group of a
// topic, before the topic is deleted.
func DropTopicLeases(tx *bolt.Tx, l *mlog.Log) error {
	for _, n := range Names(l) {
		g, err := Open(tx, l, n, false, 0)
		if err != nil {
			return err
		}
		if err := g.forEachRecord(func(p uint32, off uint64, r record) error {
			if r.State == stateLeased {
				return tx.Bucket(bktExpiry).Delete(expiryKey(r.Until, p, off, l.Topic, g.Name))
			}
			return nil
		}); err != nil {
			return err
		}
		if err := g.dropSpanExpiries(); err != nil {
			return err
		}
	}
	return nil
}

// dropSpanExpiries removes the expiry-index entries of the group's spans.
func (g *Group) dropSpanExpiries() error {
	return g.forEachSpan(func(s *span) error {
		return g.tx.Bucket(bktExpiry).Delete(spanExpiryKey(s, g.log.Topic, g.Name))
	})
}

// Timer is a due time a state change created: a lease's expiry, or when a
// waiting message (retry, delayed publish, replay) becomes deliverable. The
// leader schedules them in its timing wheel.
type Timer struct {
	Lease bool
	Topic string
	At    int64 // unix ms
}

// ReportTimers makes the group append the due times it creates to dst.
func (g *Group) ReportTimers(dst *[]Timer) { g.timers = dst }

// Tally counts what happened to a group's messages in the commands
// applied while it was reported (see ReportTally); the node exposes the
// sums as counters on /metrics.
type Tally struct {
	Nacked, LeasesExpired, DeadLettered, Replayed uint64
}

// TallySink hands out the Tally of a topic's group, created on first use.
type TallySink interface {
	Tally(topic, group string) *Tally
}

// ReportTally makes the group count the events of the commands applied to
// it into dst's Tally for it; nil stops reporting.
func (g *Group) ReportTally(dst TallySink) { g.tally = dst }

func (g *Group) count(fn func(t *Tally)) {
	if g.tally != nil {
		fn(g.tally.Tally(g.log.Topic, g.Name))
	}
}

// Save writes the changed spans, and the counters back if they changed.
func (g *Group) Save() error {
	if err := g.flushSpans(); err != nil {
		return err
	}
	if !g.dirty {
		return nil
	}
	g.dirty = false
	return g.b.Put(keyCounters, g.c.encode())
}

func (g *Group) cursor(p uint32) (uint64, error) {
	v := g.b.Bucket(bktCursor).Get(mlog.PartKey(p))
	part, err := g.log.Partition(p)
	if err != nil {
		return 0, err
	}
	if v == nil {
		return part.Meta.First, nil
	}
	next := binary.BigEndian.Uint64(v)
	if next < part.Meta.First {
		next = part.Meta.First
	}
	return next, nil
}

func (g *Group) setCursor(p uint32, next uint64) error {
	return g.b.Bucket(bktCursor).Put(mlog.PartKey(p), mlog.U64Key(next))
}

// getRecord returns the state of (p, off): its record, or a leased record
// made from the span it is leased under.
func (g *Group) getRecord(p uint32, off uint64) (record, bool, error) {
	v := g.b.Bucket(bktState).Get(stateKey(p, off))
	if v == nil {
		s, err := g.spanOf(p, off)
		if s == nil || err != nil {
			return record{}, false, err
		}
		return s.record(), true, nil
	}
	r, err := decodeRecord(v)
	return r, true, err
}

func (g *Group) putRecord(p uint32, off uint64, r record) error {
	if err := g.b.Bucket(bktState).Put(stateKey(p, off), r.encode()); err != nil {
		return err
	}
	if g.timers != nil && (r.State == stateLeased || r.State == stateReady) {
		*g.timers = append(*g.timers, Timer{Lease: r.State == stateLeased, Topic: g.log.Topic, At: r.Until})
	}
	switch r.State {
	case stateLeased:
		g.c.InFlight++
		if r.Key != "" {
			if err := g.b.Bucket(bktLeasedBy).Put([]byte(r.Key), stateKey(p, off)); err != nil {
				return err
			}
		}
		return g.tx.Bucket(bktExpiry).Put(expiryKey(r.Until, p, off, g.log.Topic, g.Name), nil)
	case stateReady:
		g.c.Ready++
		return g.b.Bucket(bktReady).Put(timedKey(r.Until, p, off), nil)
	case stateHeld:
		g.c.Held++
		return g.b.Bucket(bktHeld).Put(heldKey(r.Key, p, off), nil)
	}
	return nil
}

func heldKey(key string, p uint32, off uint64) []byte {
	k := binary.AppendUvarint(nil, uint64(len(key)))
	k = append(k, key...)
	return append(k, stateKey(p, off)...)
}

// dropIndex removes the index entry that r's state keeps and its count.
func (g *Group) dropIndex(p uint32, off uint64, r record) error {
	g.dirty = true
	switch r.State {
	case stateLeased:
		if r.span {
			return g.dropFromSpan(p, off)
		}
		g.c.InFlight--
		if r.Key != "" && bytes.Equal(g.b.Bucket(bktLeasedBy).Get([]byte(r.Key)), stateKey(p, off)) {
			if err := g.b.Bucket(bktLeasedBy).Delete([]byte(r.Key)); err != nil {
				return err
			}
		}
		return g.tx.Bucket(bktExpiry).Delete(expiryKey(r.Until, p, off, g.log.Topic, g.Name))
	case stateReady:
		g.c.Ready--
		return g.b.Bucket(bktReady).Delete(timedKey(r.Until, p, off))
	case stateHeld:
		g.c.Held--
		return g.b.Bucket(bktHeld).Delete(heldKey(r.Key, p, off))
	}
	return nil
}

// replace moves a message from record old to record r.
func (g *Group) replace(p uint32, off uint64, old, r record) error {
	if err := g.dropIndex(p, off, old); err != nil {
		return err
	}
	return g.putRecord(p, off, r)
}

func (g *Group) remove(p uint32, off uint64, old record) error {
	if err := g.dropIndex(p, off, old); err != nil {
		return err
	}
	if old.span {
		return nil
	}
	return g.b.Bucket(bktState).Delete(stateKey(p, off))
}

func (g *Group) forEachRecord(fn func(p uint32, off uint64, r record) error) error {
	type item struct {
		p   uint32
		off uint64
		r   record
	}
	var items []item
	err := g.b.Bucket(bktState).ForEach(func(k, v []byte) error {
		r, err := decodeRecord(v)
		if err != nil {
			return err
		}
		items = append(items, item{binary.BigEndian.Uint32(k), binary.BigEndian.Uint64(k[4:]), r})
		return nil
	})
	if err != nil {
		return err
	}
	for _, it := range items {
		if err := fn(it.p, it.off, it.r); err != nil {
			return err
		}
	}
	return nil
}

// Floor is the lowest offset of partition p that the group has not finished.
func (g *Group) Floor(p uint32) (uint64, error) {
	next, err := g.cursor(p)
	if err != nil {
		return 0, err
	}
	floor := next
	c := g.b.Bucket(bktState).Cursor()
	prefix := mlog.PartKey(p)
	if k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
		floor = min(floor, binary.BigEndian.Uint64(k[4:]))
	}
	off, ok, err := g.spanFloor(p)
	if err != nil {
		return 0, err
	}
	if ok {
		floor = min(floor, off)
	}
	return floor, nil
}

// OnTrim drops state for messages trimmed from the head of a partition.
func (g *Group) OnTrim(t mlog.Trimmed) error {
	type gone struct {
		off uint64
		r   record
	}
	var trimmed []gone
	c := g.b.Bucket(bktState).Cursor()
	prefix := mlog.PartKey(t.Partition)
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		off := binary.BigEndian.Uint64(k[4:])
		if off >= t.NewFirst {
			break
		}
		r, err := decodeRecord(v)
		if err != nil {
			return err
		}
		trimmed = append(trimmed, gone{off, r})
	}
	for _, x := range trimmed {
		if err := g.remove(t.Partition, x.off, x.r); err != nil {
			return err
		}
	}
	if err := g.trimSpans(t); err != nil {
		return err
	}
	// A trimmed message that held its key no longer does: the messages
	// held behind it may be delivered again.
	for _, x := range trimmed {
		if x.r.State == stateLeased && x.r.Key != "" {
			if err := g.releaseHeld(x.r.Key, 0, false); err != nil {
				return err
			}
		}
	}
	return nil
}
