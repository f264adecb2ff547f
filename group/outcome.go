package group

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mqd/mqd/dedup"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Outcomes of process calls (from state format 3): what a call that acked
// a group's receipts and published outputs in one command answered, kept
// so that a repeat of the call (a client retry after a lost answer) is
// answered the same without changing anything. An outcome is one entry in
// bucket "po", keyed by the call's raft index and first receipt (so the
// oldest sorts first), with the dedup expiry of the topic's window; every
// receipt it acked points to it from bucket "pr" (key: partition, offset;
// value: the delivery id and the outcome's key). The payload is opaque
// here (the state machine encodes the call's answer).
//
// Space is bounded twice: by the window (dedup expiry removes an outcome
// and its receipts), and per group by MaxOutcomeWeight receipts plus
// outputs, past which the oldest outcomes are dropped first.
var (
	bktOutcomes       = []byte("po")
	bktOutcomeByRcpt  = []byte("pr")
	bktOutcomeMeta    = []byte("pm")
	keyOutcomeWeight  = []byte("weight")
	errCorruptOutcome = errors.New("process outcome index out of step")
)

// MaxOutcomeWeight bounds a group's kept outcomes: their receipts plus
// outputs (a call weighs at most 2000).
const MaxOutcomeWeight = 1 << 20

// maxOutcomeWeight is MaxOutcomeWeight; tests lower it.
var maxOutcomeWeight uint64 = MaxOutcomeWeight

func (g *Group) outcomeIndex() (*dedup.Index, error) {
	return dedup.Open(g.tx, g.b, bktOutcomes, dedup.KindOutcome, g.log.Topic, g.Name)
}

func (g *Group) subBucket(name []byte) (*bolt.Bucket, error) {
	b := g.b.Bucket(name)
	if b == nil && g.tx.Writable() {
		return g.b.CreateBucket(name)
	}
	return b, nil
}

// Outcome answers the payload of the earlier process call that acked
// exactly these receipts (each of them, under its delivery id, and no
// other), if one is kept and not expired at now.
func (g *Group) Outcome(receipts []Receipt, now int64) ([]byte, bool, error) {
	pr := g.b.Bucket(bktOutcomeByRcpt)
	if pr == nil || len(receipts) == 0 {
		return nil, false, nil
	}
	var id []byte
	for _, r := range receipts {
		v := pr.Get(stateKey(r.Partition, r.Offset))
		if len(v) != 8+20 || binary.BigEndian.Uint64(v) != r.Delivery {
			return nil, false, nil
		}
		if id == nil {
			id = v[8:]
		} else if !bytes.Equal(id, v[8:]) {
			return nil, false, nil
		}
	}
	ix, err := g.outcomeIndex()
	if err != nil {
		return nil, false, err
	}
	v, ok := ix.Get(id, now)
	if !ok {
		return nil, false, nil
	}
	n, _, payload, err := decodeOutcome(v)
	if err != nil || len(n) != len(receipts) {
		return nil, false, err
	}
	return bytes.Clone(payload), true, nil
}

// RecordOutcome keeps payload as the answer of the process call at raft
// index idx that acked receipts (at now) and published outputs messages,
// until now+window, dropping the group's oldest outcomes past
// MaxOutcomeWeight. A window of 0 keeps nothing.
func (g *Group) RecordOutcome(idx uint64, now, window int64, receipts []Receipt, outputs int, payload []byte) error {
	if window <= 0 || len(receipts) == 0 {
		return nil
	}
	ix, err := g.outcomeIndex()
	if err != nil {
		return err
	}
	pr, err := g.subBucket(bktOutcomeByRcpt)
	if err != nil {
		return err
	}
	weight := uint64(len(receipts) + outputs)
	if err := g.makeOutcomeRoom(ix, pr, weight); err != nil {
		return err
	}
	id := binary.BigEndian.AppendUint64(nil, idx)
	id = append(id, stateKey(receipts[0].Partition, receipts[0].Offset)...)
	var e mlog.Enc
	e.U64(uint64(len(receipts)))
	for _, r := range receipts {
		e.U64(uint64(r.Partition))
		e.U64(r.Offset)
		v := binary.BigEndian.AppendUint64(nil, r.Delivery)
		if err := pr.Put(stateKey(r.Partition, r.Offset), append(v, id...)); err != nil {
			return err
		}
	}
	e.U64(weight)
	e.Bytes(payload)
	if err := ix.Put(id, e.B, now+window); err != nil {
		return err
	}
	return g.addOutcomeWeight(int64(weight))
}

// decodeOutcome reads an outcome entry's payload: its receipts' keys, its
// weight and the call's answer.
func decodeOutcome(v []byte) (keys [][]byte, weight uint64, payload []byte, err error) {
	d := mlog.Dec{B: v}
	n := d.Len(2)
	keys = make([][]byte, n)
	for i := range keys {
		keys[i] = stateKey(uint32(d.U64()), d.U64())
	}
	weight = d.U64()
	payload = d.Bytes()
	return keys, weight, payload, d.Err()
}

func (g *Group) outcomeWeight() uint64 {
	if m := g.b.Bucket(bktOutcomeMeta); m != nil {
		if v := m.Get(keyOutcomeWeight); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

func (g *Group) addOutcomeWeight(d int64) error {
	m, err := g.subBucket(bktOutcomeMeta)
	if err != nil {
		return err
	}
	w := int64(g.outcomeWeight()) + d
	return m.Put(keyOutcomeWeight, mlog.U64Key(uint64(max(w, 0))))
}

// makeOutcomeRoom drops the oldest outcomes until weight more fits.
func (g *Group) makeOutcomeRoom(ix *dedup.Index, pr *bolt.Bucket, weight uint64) error {
	for g.outcomeWeight()+weight > maxOutcomeWeight {
		po := g.b.Bucket(bktOutcomes)
		k, v := po.Cursor().First()
		if k == nil {
			return nil
		}
		if len(v) < 8 {
			return errCorruptOutcome
		}
		k, v = bytes.Clone(k), bytes.Clone(v)
		if err := g.dropOutcome(pr, v[8:]); err != nil {
			return err
		}
		if err := ix.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// dropOutcome removes the receipt entries of an outcome (v, its payload)
// and its weight.
func (g *Group) dropOutcome(pr *bolt.Bucket, v []byte) error {
	keys, weight, _, err := decodeOutcome(v)
	if err != nil {
		return fmt.Errorf("%w: %w", errCorruptOutcome, err)
	}
	for _, k := range keys {
		if err := pr.Delete(k); err != nil {
			return err
		}
	}
	return g.addOutcomeWeight(-int64(weight))
}

// ExpireOutcome removes a process outcome whose window has passed.
func ExpireOutcome(tx *bolt.Tx, l *mlog.Log, d dedup.Due) error {
	g, err := Open(tx, l, d.Group, false, 0)
	if errors.Is(err, ErrGroupNotFound) {
		return dedup.DropExpiry(tx, d)
	}
	if err != nil {
		return err
	}
	ix, err := g.outcomeIndex()
	if err != nil {
		return err
	}
	if po := g.b.Bucket(bktOutcomes); po != nil {
		if v := po.Get(d.Key); len(v) >= 8 && int64(binary.BigEndian.Uint64(v)) == d.Expires {
			pr, err := g.subBucket(bktOutcomeByRcpt)
			if err != nil {
				return err
			}
			if err := g.dropOutcome(pr, bytes.Clone(v[8:])); err != nil {
				return err
			}
		}
	}
	return ix.ExpireEntry(d)
}

// Check classifies receipts at now as Ack would (ok, stale or invalid),
// without writing; a receipt repeated in the list is stale the second
// time (the first ack would leave nothing for it).
func (g *Group) Check(now int64, idx uint64, receipts []Receipt) ([]string, error) {
	out := make([]string, len(receipts))
	seen := make(map[Receipt]bool, len(receipts))
	for i, r := range receipts {
		_, st, err := g.check(now, r, idx)
		if err != nil {
			return nil, err
		}
		if st == StatusOK && seen[r] {
			st = StatusStale
		}
		seen[r] = true
		out[i] = st
	}
	return out, nil
}
