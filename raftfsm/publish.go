package raftfsm

import (
	"fmt"

	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

var bktKeys = []byte("idempotency_keys")

// publishIndex opens a topic's idempotency-key index.
func publishIndex(tx *bolt.Tx, l *mlog.Log) (*dedup.Index, error) {
	return dedup.Open(tx, l.Bucket(), bktKeys, dedup.KindPublish, l.Topic, "")
}

// lookupKey answers whether key was published to topic within its window
// at now, and where. The leader does not look keys up before proposing
// (docs/performance.md), except for a message over max_message_bytes
// (Reader.Stored); the tests use it too.
func lookupKey(tx *bolt.Tx, topic, key string, now int64) (Published, bool, error) {
	l, err := mlog.Open(tx, topic)
	if err != nil {
		return Published{}, false, err
	}
	ix, err := publishIndex(tx, l)
	if err != nil {
		return Published{}, false, err
	}
	v, ok := ix.Get([]byte(key), now)
	if !ok {
		return Published{}, false, nil
	}
	p, off, err := decodePlacement(v)
	return Published{Partition: p, Offset: off, Duplicate: true}, err == nil, err
}

func encodePlacement(p uint32, off uint64) []byte {
	var e mlog.Enc
	e.U64(uint64(p))
	e.U64(off)
	return e.B
}

func decodePlacement(v []byte) (uint32, uint64, error) {
	d := mlog.Dec{B: v}
	p, off := uint32(d.U64()), d.U64()
	return p, off, d.Err()
}

// applyPublish appends a batch atomically: every check that can refuse it
// runs before the first write. Producer sequences are checked first, then
// each message's idempotency key (inside the batch too); duplicates store
// nothing and answer with the original's placement.
func applyPublish(tx *bolt.Tx, c *Command, ev *Events) (*Result, error) {
	l, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return nil, err
	}
	res := &Result{Published: make([]Published, len(c.Msgs))}
	window := l.Cfg.DedupWindowMs
	var prod *dedup.Producers
	if c.Producer != "" {
		if prod, err = dedup.OpenProducers(tx, l.Bucket(), c.Topic); err != nil {
			return nil, err
		}
		done, err := checkProducer(prod, c, res)
		if done || err != nil {
			return res, err
		}
	}
	ix, err := publishIndex(tx, l)
	if err != nil {
		return nil, err
	}
	// Decide each message: new, or a duplicate of a stored one or of an
	// earlier one in this batch.
	firstInBatch := map[string]int{}
	fresh := make([]bool, len(c.Msgs))
	var n, size uint64
	// From state format 2 a repeat is answered as one even if it is over
	// the topic's max_message_bytes (lowered since the original was
	// stored); format 1 checked the size first, and a replica must decide
	// as the others do.
	sizeFirst := ev.format < 2
	for i, m := range c.Msgs {
		if sizeFirst {
			if err := l.CheckSize(len(m.Msg.Value)); err != nil {
				return nil, err
			}
		}
		if k := m.Msg.IdempotencyKey; k != "" && window > 0 {
			if v, ok := ix.Get([]byte(k), c.Now); ok {
				p, off, err := decodePlacement(v)
				if err != nil {
					return nil, err
				}
				res.Published[i] = Published{Partition: p, Offset: off, Duplicate: true}
				continue
			}
			if _, ok := firstInBatch[k]; ok {
				continue // placed below, once the first is stored
			}
			firstInBatch[k] = i
		}
		if !sizeFirst {
			if err := l.CheckSize(len(m.Msg.Value)); err != nil {
				return nil, err
			}
		}
		fresh[i] = true
		n++
		size += uint64(len(m.Msg.Value))
	}
	trimmed, err := l.MakeRoom(n, size)
	if err != nil {
		return nil, err
	}
	if err := trimGroups(tx, l, trimmed); err != nil {
		return nil, err
	}
	for i, m := range c.Msgs {
		if !fresh[i] {
			continue
		}
		// The leader chose the partition against the config it saw;
		// partitions only grow, so the modulo keeps it in range.
		p := m.Partition % l.Cfg.Partitions
		part, err := l.Partition(p)
		if err != nil {
			return nil, err
		}
		m.Msg.PublishedAt = c.Now
		off, err := part.Append(m.Msg)
		if err != nil {
			return nil, err
		}
		res.Published[i] = Published{Partition: p, Offset: off}
		if k := m.Msg.IdempotencyKey; k != "" && window > 0 {
			if err := ix.Put([]byte(k), encodePlacement(p, off), c.Now+window); err != nil {
				return nil, err
			}
		}
	}
	for i, m := range c.Msgs {
		if !fresh[i] && !res.Published[i].Duplicate {
			first := res.Published[firstInBatch[m.Msg.IdempotencyKey]]
			res.Published[i] = Published{Partition: first.Partition, Offset: first.Offset, Duplicate: true}
		}
	}
	if prod != nil {
		for i, pub := range res.Published {
			if err := prod.Record(c.Producer, c.Seq+uint64(i), pub.Partition, pub.Offset, c.Now+max(window, minProducerIdle)); err != nil {
				return nil, err
			}
		}
	}
	if n > 0 {
		ev.wake(c.Topic)
	}
	return res, nil
}

// minProducerIdle is the least time an idle producer's state is kept, even
// on a topic whose dedup window is shorter (or 0).
const minProducerIdle = 60 * 60 * 1000

// checkProducer applies the producer-sequence rule to the whole request:
// its first sequence decides. It reports done when the request is a repeat
// answered from history.
func checkProducer(prod *dedup.Producers, c *Command, res *Result) (bool, error) {
	chk := prod.Check(c.Producer, c.Seq, c.Now)
	switch chk.Verdict {
	case dedup.SeqNew:
		return false, nil
	case dedup.SeqGap:
		res.Expected = chk.Expected
		return true, fmt.Errorf("%w: producer %q sent sequence %d, expected %d", ErrSeqGap, c.Producer, c.Seq, chk.Expected)
	case dedup.SeqTooOld:
		res.Expected = chk.Expected
		return true, fmt.Errorf("%w: producer %q sequence %d (next expected %d)", ErrSeqTooOld, c.Producer, c.Seq, chk.Expected)
	}
	for i := range c.Msgs {
		chk := prod.Check(c.Producer, c.Seq+uint64(i), c.Now)
		if chk.Verdict != dedup.SeqDuplicate {
			// The first sequence was stored, so this one is the next expected.
			res.Expected = c.Seq + uint64(i)
			return true, fmt.Errorf("%w: batch from producer %q, sequences %d..%d, repeats stored ones and adds new ones (next expected %d); send only the new ones",
				ErrSeqOverlap, c.Producer, c.Seq, c.Seq+uint64(len(c.Msgs))-1, res.Expected)
		}
		res.Published[i] = Published{Partition: chk.Partition, Offset: chk.Offset, Duplicate: true}
	}
	return true, nil
}

// applyDedupExpire removes up to c.Max due dedup entries, oldest first.
func applyDedupExpire(tx *bolt.Tx, c *Command) error {
	due, err := dedup.DueEntries(tx, c.Now, int(c.Max))
	if err != nil {
		return err
	}
	for _, d := range due {
		if err := expireEntry(tx, d); err != nil {
			return err
		}
	}
	return nil
}

func expireEntry(tx *bolt.Tx, d dedup.Due) error {
	l, err := mlog.Open(tx, d.Topic)
	if err != nil {
		return dedup.DropExpiry(tx, d) // topic deleted
	}
	switch d.Kind {
	case dedup.KindPublish:
		ix, err := publishIndex(tx, l)
		if err != nil {
			return err
		}
		return ix.ExpireEntry(d)
	case dedup.KindProducer:
		prod, err := dedup.OpenProducers(tx, l.Bucket(), d.Topic)
		if err != nil {
			return err
		}
		return prod.Expire(d)
	case dedup.KindProcessed:
		return group.ExpireProcessed(tx, l, d)
	}
	return fmt.Errorf("%w: dedup expiry kind %q", mlog.ErrCorrupt, d.Kind)
}
