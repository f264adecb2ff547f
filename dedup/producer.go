package dedup

import (
	"bytes"
	"encoding/binary"
	"fmt"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// SeqHistory is how many of a producer's latest sequences keep their
// placement, so that a repeat of one of them answers with its offset.
const SeqHistory = 1024

// Verdict is what a producer sequence check decided.
type Verdict int

// Verdicts.
const (
	SeqNew       Verdict = iota // last+1, or a producer mqd does not know
	SeqDuplicate                // already stored: Partition and Offset say where
	SeqGap                      // beyond last+1: Expected says what must come next
	SeqTooOld                   // a repeat older than the kept history
)

// SeqCheck is the outcome of Producers.Check.
type SeqCheck struct {
	Verdict   Verdict
	Expected  uint64
	Partition uint32
	Offset    uint64
}

// Producers is one topic's producer-sequence state: last sequence per
// producer (with expiry) and the placement of its latest sequences.
type Producers struct {
	state *Index
	hist  *bolt.Bucket
}

var (
	bktProducers = []byte("producers")
	bktSeqs      = []byte("producer_seqs")
)

// OpenProducers opens a topic's producer state inside topic bucket tb.
func OpenProducers(tx *bolt.Tx, tb *bolt.Bucket, topic string) (*Producers, error) {
	st, err := Open(tx, tb, bktProducers, KindProducer, topic, "")
	if err != nil {
		return nil, err
	}
	h := tb.Bucket(bktSeqs)
	if h == nil && tx.Writable() {
		if h, err = tb.CreateBucket(bktSeqs); err != nil {
			return nil, err
		}
	}
	return &Producers{state: st, hist: h}, nil
}

func seqKey(id string, seq uint64) []byte {
	k := binary.AppendUvarint(nil, uint64(len(id)))
	k = append(k, id...)
	return binary.BigEndian.AppendUint64(k, seq)
}

// Check classifies sequence seq of producer id at now.
func (ps *Producers) Check(id string, seq uint64, now int64) SeqCheck {
	v, ok := ps.state.Get([]byte(id), now)
	if !ok || len(v) < 8 {
		return SeqCheck{Verdict: SeqNew}
	}
	last := binary.BigEndian.Uint64(v)
	switch {
	case seq == last+1:
		return SeqCheck{Verdict: SeqNew}
	case seq > last+1:
		return SeqCheck{Verdict: SeqGap, Expected: last + 1}
	}
	if ps.hist != nil {
		if pv := ps.hist.Get(seqKey(id, seq)); len(pv) == 12 {
			return SeqCheck{Verdict: SeqDuplicate, Partition: binary.BigEndian.Uint32(pv), Offset: binary.BigEndian.Uint64(pv[4:])}
		}
	}
	return SeqCheck{Verdict: SeqTooOld, Expected: last + 1}
}

// Record notes that seq of producer id was stored at (p, off); the
// producer's state lives until expires.
func (ps *Producers) Record(id string, seq uint64, p uint32, off uint64, expires int64) error {
	if err := ps.state.Put([]byte(id), mlog.U64Key(seq), expires); err != nil {
		return err
	}
	pv := make([]byte, 12)
	binary.BigEndian.PutUint32(pv, p)
	binary.BigEndian.PutUint64(pv[4:], off)
	if err := ps.hist.Put(seqKey(id, seq), pv); err != nil {
		return err
	}
	if seq >= SeqHistory {
		return ps.hist.Delete(seqKey(id, seq-SeqHistory))
	}
	return nil
}

// Expire removes producer id's state and history if d is still its expiry.
func (ps *Producers) Expire(d Due) error {
	if v := ps.state.b.Get(d.Key); len(v) >= 8 && int64(binary.BigEndian.Uint64(v)) == d.Expires && ps.hist != nil {
		prefix := seqKey(string(d.Key), 0)
		prefix = prefix[:len(prefix)-8]
		c := ps.hist.Cursor()
		var keys [][]byte
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := ps.hist.Delete(k); err != nil {
				return fmt.Errorf("producer history: %w", err)
			}
		}
	}
	return ps.state.ExpireEntry(d)
}
