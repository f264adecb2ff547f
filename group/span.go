package group

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"

	mlog "github.com/mqd/mqd/log"
)

// Range lease records ("spans").
//
// Most deliveries are a message's first: no idempotency key, not delayed,
// no retry history. A lease hands such messages out in runs, partition by
// partition, all with one delivery id and one expiry. Instead of a record
// and an expiry-index entry per message, the group writes one span per
// partition and lease: the key (partition, first offset) holds the
// delivery id, the expiry and a bitmap of the offsets still leased under
// it, and the root expiry index holds one entry for the span. An ack clears
// a bit; the span and its expiry entry go when the last bit does.
//
// Everything else stays per message: a leased message whose lease is
// extended, nacked or expired leaves its span (its bit is cleared) and gets
// a record of its own, as do keyed, delayed, retried, replayed and dead
// messages. getRecord answers for both, so the rules of check, Ack, Nack,
// Extend and ExpireLease are the same code whatever the layout.
//
// Invariants: a message is in at most one of a record and a span bit; a
// span's set bits lie below the group's cursor, and spans of one partition
// never share a leased offset (a later span's bits are all above an earlier
// one's, as the cursor only moves forward); a span with no bit set is
// deleted with its expiry entry.

var bktSpans = []byte("dr")

// maxSpanBits bounds a span's width: a lease scans at most maxScan
// messages.
const maxSpanBits = maxScan

type span struct {
	p        uint32
	first    uint64
	delivery uint64
	until    int64
	bits     []byte // bit i (LSB first): first+i is leased under the span
	live     int    // bits set
	stored   bool   // the span is in the bucket with its expiry entry
	dirty    bool
}

func (s *span) has(off uint64) bool {
	if off < s.first || off-s.first >= uint64(len(s.bits))*8 {
		return false
	}
	i := off - s.first
	return s.bits[i/8]&(1<<(i%8)) != 0
}

func (s *span) set(off uint64) {
	i := off - s.first
	for uint64(len(s.bits)) <= i/8 {
		s.bits = append(s.bits, 0)
	}
	s.bits[i/8] |= 1 << (i % 8)
	s.live++
	s.dirty = true
}

func (s *span) clear(off uint64) {
	i := off - s.first
	s.bits[i/8] &^= 1 << (i % 8)
	s.live--
	s.dirty = true
}

// offsets lists the offsets still leased under the span, lowest first.
func (s *span) offsets() []uint64 {
	out := make([]uint64, 0, s.live)
	for i, b := range s.bits {
		for b != 0 {
			j := bits.TrailingZeros8(b)
			out = append(out, s.first+uint64(i*8+j))
			b &^= 1 << j
		}
	}
	return out
}

func (s *span) record() record {
	return record{State: stateLeased, Delivery: s.delivery, Until: s.until, span: true}
}

func (s *span) encode() []byte {
	var e mlog.Enc
	e.U64(s.delivery)
	e.I64(s.until)
	e.Bytes(s.bits)
	return e.B
}

func decodeSpan(k, v []byte) (*span, error) {
	if len(k) != 12 {
		return nil, fmt.Errorf("span key %x: %w", k, mlog.ErrCorrupt)
	}
	d := mlog.Dec{B: v}
	s := &span{p: binary.BigEndian.Uint32(k), first: binary.BigEndian.Uint64(k[4:]), stored: true}
	s.delivery, s.until = d.U64(), d.I64()
	s.bits = bytes.Clone(d.Bytes())
	if err := d.Err(); err != nil {
		return nil, err
	}
	if len(s.bits)*8 > maxSpanBits+8 {
		return nil, fmt.Errorf("span %d/%d of %d bits: %w", s.p, s.first, len(s.bits)*8, mlog.ErrCorrupt)
	}
	for _, b := range s.bits {
		s.live += bits.OnesCount8(b)
	}
	return s, nil
}

// spanExpiryKey is a span's entry in the root expiry index: a lease's key
// with a trailing zero byte, which no group name contains.
func spanExpiryKey(s *span, topic, group string) []byte {
	return append(expiryKey(s.until, s.p, s.first, topic, group), 0)
}

// cachedSpan returns the loaded span that starts at (p, first), if any.
func (g *Group) cachedSpan(p uint32, first uint64) *span {
	for _, s := range g.spanCache {
		if s.p == p && s.first == first {
			return s
		}
	}
	return nil
}

// spanOf returns the span that leases (p, off), or nil.
func (g *Group) spanOf(p uint32, off uint64) (*span, error) {
	for _, s := range g.spanCache {
		if s.p == p && s.has(off) {
			return s, nil
		}
	}
	b := g.b.Bucket(bktSpans)
	if b == nil {
		return nil, nil
	}
	c := b.Cursor()
	k, v := c.Seek(stateKey(p, off))
	if k == nil || !bytes.Equal(k, stateKey(p, off)) {
		if k == nil {
			k, v = c.Last()
		} else {
			k, v = c.Prev()
		}
	}
	if k == nil || binary.BigEndian.Uint32(k) != p {
		return nil, nil
	}
	if s := g.cachedSpan(p, binary.BigEndian.Uint64(k[4:])); s != nil {
		return nil, nil // loaded, and it does not hold off
	}
	s, err := decodeSpan(k, v)
	if err != nil {
		return nil, err
	}
	g.spanCache = append(g.spanCache, s)
	if !s.has(off) {
		return nil, nil
	}
	return s, nil
}

// leaseInSpan leases the new message at (p, off) under the lease's span of
// partition p, started on first use.
func (lz *leaser) leaseInSpan(p uint32, off uint64) {
	g := lz.g
	s := lz.spans[p]
	if s == nil {
		s = &span{p: p, first: off, delivery: lz.idx, until: lz.until}
		if lz.spans == nil {
			lz.spans = map[uint32]*span{}
		}
		lz.spans[p] = s
		g.spanCache = append(g.spanCache, s)
		if g.timers != nil {
			*g.timers = append(*g.timers, Timer{Lease: true, Topic: g.log.Topic, At: s.until})
		}
	}
	s.set(off)
	g.c.InFlight++
	g.dirty = true
}

// dropFromSpan takes (p, off) out of its span: acked, trimmed, or moved
// to a record of its own.
func (g *Group) dropFromSpan(p uint32, off uint64) error {
	s, err := g.spanOf(p, off)
	if err != nil {
		return err
	}
	if s == nil {
		return errCorruptIndex(p, off)
	}
	s.clear(off)
	g.c.InFlight--
	g.dirty = true
	return nil
}

// flushSpans writes the changed spans: a span left with no bit set is
// deleted with its expiry entry.
func (g *Group) flushSpans() error {
	keep := g.spanCache[:0]
	for _, s := range g.spanCache {
		if err := g.flushSpan(s); err != nil {
			return err
		}
		if s.live > 0 || !s.dirty {
			keep = append(keep, s)
		}
		s.dirty = false
	}
	clear(g.spanCache[len(keep):])
	g.spanCache = keep
	return nil
}

func (g *Group) flushSpan(s *span) error {
	if !s.dirty {
		return nil
	}
	exp := g.tx.Bucket(bktExpiry)
	if s.live == 0 {
		if !s.stored {
			return nil
		}
		s.stored = false
		if err := g.b.Bucket(bktSpans).Delete(stateKey(s.p, s.first)); err != nil {
			return err
		}
		return exp.Delete(spanExpiryKey(s, g.log.Topic, g.Name))
	}
	b, err := g.b.CreateBucketIfNotExists(bktSpans)
	if err != nil {
		return err
	}
	if err := b.Put(stateKey(s.p, s.first), s.encode()); err != nil {
		return err
	}
	if s.stored {
		return nil
	}
	s.stored = true
	return exp.Put(spanExpiryKey(s, g.log.Topic, g.Name), nil)
}

// forEachSpan calls fn with every span of the group, after writing the
// changed ones, in key order.
func (g *Group) forEachSpan(fn func(s *span) error) error {
	if err := g.flushSpans(); err != nil {
		return err
	}
	b := g.b.Bucket(bktSpans)
	if b == nil {
		return nil
	}
	var all []*span
	err := b.ForEach(func(k, v []byte) error {
		s := g.cachedSpan(binary.BigEndian.Uint32(k), binary.BigEndian.Uint64(k[4:]))
		if s == nil {
			var err error
			if s, err = decodeSpan(k, v); err != nil {
				return err
			}
		}
		all = append(all, s)
		return nil
	})
	if err != nil {
		return err
	}
	for _, s := range all {
		if err := fn(s); err != nil {
			return err
		}
	}
	return nil
}

// spanFloor is the lowest offset of partition p leased under a span, if
// any.
func (g *Group) spanFloor(p uint32) (uint64, bool, error) {
	if err := g.flushSpans(); err != nil {
		return 0, false, err
	}
	b := g.b.Bucket(bktSpans)
	if b == nil {
		return 0, false, nil
	}
	c := b.Cursor()
	prefix := mlog.PartKey(p)
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		s, err := decodeSpan(k, v)
		if err != nil {
			return 0, false, err
		}
		if offs := s.offsets(); len(offs) > 0 {
			return offs[0], true, nil
		}
	}
	return 0, false, nil
}

// trimSpans drops the span bits of partition t.Partition below t.NewFirst.
func (g *Group) trimSpans(t mlog.Trimmed) error {
	return g.forEachSpan(func(s *span) error {
		if s.p != t.Partition || s.first >= t.NewFirst {
			return nil
		}
		for _, off := range s.offsets() {
			if off >= t.NewFirst {
				break
			}
			if g.cachedSpan(s.p, s.first) == nil {
				g.spanCache = append(g.spanCache, s)
			}
			s.clear(off)
			g.c.InFlight--
			g.dirty = true
		}
		return nil
	})
}

// dueSpan expands the span at (p, first) of an expiry entry into its
// leases, appending up to limit of them to out.
func (g *Group) dueSpan(p uint32, first uint64, out []Expired, limit int) ([]Expired, error) {
	s := g.cachedSpan(p, first)
	if s == nil {
		b := g.b.Bucket(bktSpans)
		var v []byte
		if b != nil {
			v = b.Get(stateKey(p, first))
		}
		if v == nil {
			return nil, errCorruptIndex(p, first)
		}
		var err error
		if s, err = decodeSpan(stateKey(p, first), v); err != nil {
			return nil, err
		}
	}
	for _, off := range s.offsets() {
		if len(out) >= limit {
			break
		}
		out = append(out, Expired{Topic: g.log.Topic, Group: g.Name,
			Receipt: Receipt{Partition: p, Offset: off, Delivery: s.delivery}})
	}
	return out, nil
}
