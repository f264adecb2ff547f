package fsm

import (
	"fmt"

	"github.com/mqd/mqd/command"
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

// A publish index entry is the placement, and from state format 3 the
// count of publishes answered as its duplicates once there was one
// (absent: none). decodePlacement reads the placement alone, as binaries
// before format 3 do.
func encodeKeyEntry(p uint32, off, dups uint64) []byte {
	b := encodePlacement(p, off)
	if dups == 0 {
		return b
	}
	e := mlog.Enc{B: b}
	e.U64(dups)
	return e.B
}

func decodeKeyEntry(v []byte) (p uint32, off, dups uint64, err error) {
	d := mlog.Dec{B: v}
	p, off = uint32(d.U64()), d.U64()
	if d.Err() == nil && len(d.B) > 0 {
		dups = d.U64()
	}
	return p, off, dups, d.Err()
}

// countDuplicates adds the plan's duplicates by key (of a stored message
// or of an earlier one in the batch) to their keys' entries, in the order
// the keys first appear (replicas write alike).
func (p *pubPlan) countDuplicates() error {
	if p.window <= 0 {
		return nil
	}
	var keys []string
	add := map[string]uint64{}
	for i, m := range p.msgs {
		k := m.Msg.IdempotencyKey
		if p.fresh[i] || k == "" {
			continue
		}
		if add[k] == 0 {
			keys = append(keys, k)
		}
		add[k]++
	}
	for _, k := range keys {
		v, ok := p.ix.Get([]byte(k), p.now)
		if !ok {
			continue
		}
		pl, off, dups, err := decodeKeyEntry(v)
		if err != nil {
			return err
		}
		if err := p.ix.SetPayload([]byte(k), encodeKeyEntry(pl, off, dups+add[k])); err != nil {
			return err
		}
	}
	return nil
}

// applyPublish appends a batch atomically: every check that can refuse it
// runs before the first write. Producer sequences are checked first, then
// each message's idempotency key (inside the batch too); duplicates store
// nothing and answer with the original's placement.
func applyPublish(tx *bolt.Tx, c *command.Command, ev *Events) (*Result, error) {
	l, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	var prod *dedup.Producers
	if c.Producer != "" {
		res.Published = make([]Published, len(c.Msgs))
		if prod, err = dedup.OpenProducers(tx, l.Bucket(), c.Topic); err != nil {
			return nil, err
		}
		done, err := checkProducer(prod, c, res)
		if done || err != nil {
			return res, err
		}
	}
	plan, err := planPublish(tx, l, c.Msgs, c.Now, ev.format)
	if err != nil {
		return nil, err
	}
	if err := l.CheckRoom(plan.n, plan.size); err != nil {
		return nil, err
	}
	if err := plan.commit(tx, ev); err != nil {
		return nil, err
	}
	res.Published = plan.res
	if prod != nil {
		for i, pub := range res.Published {
			if err := prod.Record(c.Producer, c.Seq+uint64(i), pub.Partition, pub.Offset, c.Now+max(plan.window, minProducerIdle)); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// pubPlan is what a publish of msgs to one topic will do, decided without
// writing (planPublish), so that a command publishing to several topics
// refuses before it changes any of them; commit then writes it.
type pubPlan struct {
	l      *mlog.Log
	ix     *dedup.Index
	msgs   []mlog.Placed
	now    int64
	window int64
	format int
	fresh  []bool
	// firstInBatch: the first message of the batch with each key.
	firstInBatch map[string]int
	n, size      uint64 // the fresh messages and their bytes
	res          []Published
}

// planPublish decides each message: new, or a duplicate of a stored one
// or of an earlier one in this batch; and refuses one over the topic's
// max_message_bytes.
func planPublish(tx *bolt.Tx, l *mlog.Log, msgs []mlog.Placed, now int64, format int) (*pubPlan, error) {
	ix, err := publishIndex(tx, l)
	if err != nil {
		return nil, err
	}
	p := &pubPlan{l: l, ix: ix, msgs: msgs, now: now, window: l.Cfg.DedupWindowMs, format: format,
		fresh: make([]bool, len(msgs)), firstInBatch: map[string]int{}, res: make([]Published, len(msgs))}
	// From state format 2 a repeat is answered as one even if it is over
	// the topic's max_message_bytes (lowered since the original was
	// stored); format 1 checked the size first, and a replica must decide
	// as the others do.
	sizeFirst := format < 2
	for i, m := range msgs {
		if sizeFirst {
			if err := l.CheckSize(len(m.Msg.Value)); err != nil {
				return nil, err
			}
		}
		if k := m.Msg.IdempotencyKey; k != "" && p.window > 0 {
			if v, ok := ix.Get([]byte(k), now); ok {
				pl, off, err := decodePlacement(v)
				if err != nil {
					return nil, err
				}
				p.res[i] = Published{Partition: pl, Offset: off, Duplicate: true}
				continue
			}
			if _, ok := p.firstInBatch[k]; ok {
				continue // placed by commit, once the first is stored
			}
			p.firstInBatch[k] = i
		}
		if !sizeFirst {
			if err := l.CheckSize(len(m.Msg.Value)); err != nil {
				return nil, err
			}
		}
		p.fresh[i] = true
		p.n++
		p.size += uint64(len(m.Msg.Value))
	}
	return p, nil
}

// commit writes the plan: room made (a drop-head topic trims), the fresh
// messages appended and their keys indexed, the duplicates placed.
func (p *pubPlan) commit(tx *bolt.Tx, ev *Events) error {
	l := p.l
	trimmed, err := l.MakeRoom(p.n, p.size)
	if err != nil {
		return err
	}
	if err := trimGroups(tx, l, trimmed); err != nil {
		return err
	}
	for i, m := range p.msgs {
		if !p.fresh[i] {
			continue
		}
		// The leader chose the partition against the config it saw;
		// partitions only grow, so the modulo keeps it in range.
		pt := m.Partition % l.Cfg.Partitions
		part, err := l.Partition(pt)
		if err != nil {
			return err
		}
		m.Msg.PublishedAt = p.now
		off, err := part.Append(m.Msg)
		if err != nil {
			return err
		}
		p.res[i] = Published{Partition: pt, Offset: off}
		if k := m.Msg.IdempotencyKey; k != "" && p.window > 0 {
			if err := p.ix.Put([]byte(k), encodePlacement(pt, off), p.now+p.window); err != nil {
				return err
			}
		}
	}
	for i, m := range p.msgs {
		if !p.fresh[i] && !p.res[i].Duplicate {
			first := p.res[p.firstInBatch[m.Msg.IdempotencyKey]]
			p.res[i] = Published{Partition: first.Partition, Offset: first.Offset, Duplicate: true}
		}
	}
	if p.format >= 3 {
		if err := p.countDuplicates(); err != nil {
			return err
		}
	}
	if p.n > 0 {
		ev.wake(l.Topic)
	}
	return nil
}

// minProducerIdle is the least time an idle producer's state is kept, even
// on a topic whose dedup window is shorter (or 0).
const minProducerIdle = 60 * 60 * 1000

// checkProducer applies the producer-sequence rule to the whole request:
// its first sequence decides. It reports done when the request is a repeat
// answered from history.
func checkProducer(prod *dedup.Producers, c *command.Command, res *Result) (bool, error) {
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
func applyDedupExpire(tx *bolt.Tx, c *command.Command) error {
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
	case dedup.KindOutcome:
		return group.ExpireOutcome(tx, l, d)
	}
	return fmt.Errorf("%w: dedup expiry kind %q", mlog.ErrCorrupt, d.Kind)
}
