package log

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// PartitionMeta is the bookkeeping of one partition.
type PartitionMeta struct {
	First uint64 // offset of the oldest retained message
	Next  uint64 // offset the next message will get (exclusive end)
	Bytes uint64 // payload bytes retained
}

// Count is the number of retained messages.
func (m PartitionMeta) Count() uint64 { return m.Next - m.First }

func encodeMeta(m PartitionMeta) []byte {
	var e Enc
	e.U64(m.First)
	e.U64(m.Next)
	e.U64(m.Bytes)
	return e.B
}

func decodeMeta(b []byte) (PartitionMeta, error) {
	d := Dec{B: b}
	m := PartitionMeta{First: d.U64(), Next: d.U64(), Bytes: d.U64()}
	return m, d.Err()
}

func ensurePartitions(parts *bolt.Bucket, n uint32) error {
	for i := uint32(0); i < n; i++ {
		if parts.Bucket(PartKey(i)) != nil {
			continue
		}
		pb, err := parts.CreateBucket(PartKey(i))
		if err != nil {
			return fmt.Errorf("create partition %d: %w", i, err)
		}
		if _, err := pb.CreateBucket(bktMsgs); err != nil {
			return err
		}
		if err := pb.Put(keyMeta, encodeMeta(PartitionMeta{})); err != nil {
			return err
		}
	}
	return nil
}

// Partition is a handle on one partition inside a transaction.
type Partition struct {
	b    *bolt.Bucket
	msgs *bolt.Bucket
	Meta PartitionMeta
	ID   uint32
}

// OpenPartition returns partition p of a topic.
func OpenPartition(tx *bolt.Tx, topic string, p uint32) (*Partition, error) {
	tb, err := TopicBucket(tx, topic)
	if err != nil {
		return nil, err
	}
	return openPartition(tb, p)
}

func openPartition(tb *bolt.Bucket, p uint32) (*Partition, error) {
	pb := tb.Bucket(bktParts).Bucket(PartKey(p))
	if pb == nil {
		return nil, fmt.Errorf("%w: no partition %d", ErrCorrupt, p)
	}
	m, err := decodeMeta(pb.Get(keyMeta))
	if err != nil {
		return nil, err
	}
	msgs := pb.Bucket(bktMsgs)
	// Offsets only grow and trimming removes the oldest: leaves split
	// full instead of half full (bbolt's default), so pages hold the
	// payload once rather than twice (the setting lives on this handle).
	msgs.FillPercent = msgsFillPercent
	return &Partition{b: pb, msgs: msgs, Meta: m, ID: p}, nil
}

// msgsFillPercent is the message buckets' split threshold: bbolt's
// maximum, for append-only keys.
const msgsFillPercent = 1.0

// Partitions returns the metadata of every partition of a topic.
func Partitions(tx *bolt.Tx, topic string) ([]PartitionMeta, error) {
	cfg, err := GetConfig(tx, topic)
	if err != nil {
		return nil, err
	}
	tb, _ := TopicBucket(tx, topic)
	out := make([]PartitionMeta, cfg.Partitions)
	for i := range out {
		p, err := openPartition(tb, uint32(i))
		if err != nil {
			return nil, err
		}
		out[i] = p.Meta
	}
	return out, nil
}

func (p *Partition) saveMeta() error { return p.b.Put(keyMeta, encodeMeta(p.Meta)) }

// Append stores m at the partition's next offset and returns that offset.
func (p *Partition) Append(m *Message) (uint64, error) {
	off := p.Meta.Next
	if err := p.msgs.Put(U64Key(off), m.encode()); err != nil {
		return 0, fmt.Errorf("append: %w", err)
	}
	p.Meta.Next++
	p.Meta.Bytes += uint64(len(m.Value))
	return off, p.saveMeta()
}

// Get returns the message at off, or nil if it is not retained. The message
// aliases the transaction's memory: Clone it to keep it past the transaction.
func (p *Partition) Get(off uint64) (*Message, error) {
	return p.getRaw(off, p.msgs.Get(U64Key(off)))
}

func (p *Partition) getRaw(off uint64, v []byte) (*Message, error) {
	if v == nil {
		return nil, nil
	}
	m, err := decodeMessage(v)
	if err != nil {
		return nil, fmt.Errorf("partition %d offset %d: %w", p.ID, off, err)
	}
	m.Offset = off
	return m, nil
}

// HeadTime returns the publish time of the oldest retained message, and
// false when the partition is empty.
func (p *Partition) HeadTime() (int64, bool, error) {
	if p.Meta.Count() == 0 {
		return 0, false, nil
	}
	m, err := p.Get(p.Meta.First)
	if err != nil || m == nil {
		return 0, false, err
	}
	return m.PublishedAt, true, nil
}

// TrimTo deletes every message below off (at most up to Next) and returns
// how many it deleted.
func (p *Partition) TrimTo(off uint64) (uint64, error) {
	if off > p.Meta.Next {
		off = p.Meta.Next
	}
	var n uint64
	c := p.msgs.Cursor()
	for p.Meta.First < off {
		// One seek per message: the cursor finds it and deletes it.
		k := U64Key(p.Meta.First)
		if ck, v := c.Seek(k); bytes.Equal(ck, k) {
			if m, err := decodeMessage(v); err == nil && p.Meta.Bytes >= uint64(len(m.Value)) {
				p.Meta.Bytes -= uint64(len(m.Value))
			}
			if err := c.Delete(); err != nil {
				return n, err
			}
		}
		p.Meta.First++
		n++
	}
	if n == 0 {
		return 0, nil
	}
	if p.Meta.First == p.Meta.Next {
		p.Meta.Bytes = 0
	}
	return n, p.saveMeta()
}

// Head returns the due time (0: at once) and idempotency key of the
// message at off, decoding only the record's head; ok is false when the
// message is not retained.
func (p *Partition) Head(off uint64) (deliverAt int64, key string, ok bool, err error) {
	return headRaw(p.msgs.Get(U64Key(off)))
}

func headRaw(v []byte) (deliverAt int64, key string, ok bool, err error) {
	if v == nil {
		return 0, "", false, nil
	}
	d := Dec{B: v}
	if ver := d.Byte(); ver != messageVersion && d.Err() == nil {
		return 0, "", false, fmt.Errorf("%w: message version %d", ErrCorrupt, ver)
	}
	d.I64() // published at
	deliverAt = d.I64()
	key = d.Str()
	return deliverAt, key, true, d.Err()
}

// Scanner reads a partition's messages in rising offset order: reading the
// offset right after the one read before steps the cursor to the next key
// instead of searching the tree from its root. Reading any other offset
// seeks. The partition's messages must not change while it is in use.
type Scanner struct {
	p    *Partition
	c    *bolt.Cursor
	next uint64 // with on: the offset of the cursor's next key, if present
	on   bool   // the cursor is on the key of offset next-1
	last int    // the size of the record read last (0: none)
}

// Scanner returns a Scanner of the partition.
func (p *Partition) Scanner() *Scanner { return &Scanner{p: p, c: p.msgs.Cursor()} }

func (s *Scanner) raw(off uint64) []byte {
	var k, v []byte
	if s.on && off == s.next {
		k, v = s.c.Next()
	} else {
		k, v = s.c.Seek(U64Key(off))
	}
	if len(k) != 8 || binary.BigEndian.Uint64(k) != off {
		s.on, s.last = false, 0
		return nil
	}
	s.on, s.next, s.last = true, off+1, len(v)
	return v
}

// LastSize is the size in bytes of the stored record read last (its
// value and head), 0 if that offset held no message.
func (s *Scanner) LastSize() int { return s.last }

// Head is Partition.Head, read through the scanner.
func (s *Scanner) Head(off uint64) (deliverAt int64, key string, ok bool, err error) {
	return headRaw(s.raw(off))
}

// Get is Partition.Get, read through the scanner.
func (s *Scanner) Get(off uint64) (*Message, error) { return s.p.getRaw(off, s.raw(off)) }
