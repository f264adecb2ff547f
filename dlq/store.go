package dlq

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// ErrNotFound reports an unknown dead-letter id.
var ErrNotFound = refusal.New(404, "dead_letter_not_found", "dead letter not found")

var (
	bktLetters = []byte("dlq")
	bktByKey   = []byte("dlq_keys")
	bktReplay  = []byte("dlq_replay")
	keyMeta    = []byte("dlq_meta")
)

// meta is the store's bookkeeping.
type meta struct {
	NextID      uint64
	Count       uint64
	ReplayAllTo uint64 // every letter with id <= this is queued for replay
	ReplayRate  uint64 // letters per second
	Pending     uint64 // letters queued for replay
	Replayed    uint64
	Skipped     uint64 // queued letters whose message was gone
}

func (m meta) encode() []byte {
	var e mlog.Enc
	for _, v := range []uint64{m.NextID, m.Count, m.ReplayAllTo, m.ReplayRate, m.Pending, m.Replayed, m.Skipped} {
		e.U64(v)
	}
	return e.B
}

// Store is one group's dead letters, inside the group's bucket.
type Store struct {
	b    *bolt.Bucket
	m    meta
	read bool
}

// Open opens (creating when writable) the store in group bucket gb.
func Open(gb *bolt.Bucket, writable bool) (*Store, error) {
	s := &Store{b: gb, read: !writable}
	if writable {
		for _, n := range [][]byte{bktLetters, bktByKey, bktReplay} {
			if _, err := gb.CreateBucketIfNotExists(n); err != nil {
				return nil, fmt.Errorf("dlq bucket: %w", err)
			}
		}
	}
	if v := gb.Get(keyMeta); v != nil {
		d := mlog.Dec{B: v}
		for _, p := range []*uint64{&s.m.NextID, &s.m.Count, &s.m.ReplayAllTo, &s.m.ReplayRate, &s.m.Pending, &s.m.Replayed, &s.m.Skipped} {
			*p = d.U64()
		}
		if err := d.Err(); err != nil {
			return nil, err
		}
	}
	if s.m.NextID == 0 {
		s.m.NextID = 1
	}
	return s, nil
}

func (s *Store) save() error { return s.b.Put(keyMeta, s.m.encode()) }

func (s *Store) bucket(name []byte) *bolt.Bucket { return s.b.Bucket(name) }

// Count is the number of dead letters.
func (s *Store) Count() uint64 { return s.m.Count }

// ReplayPending is the number of letters queued for replay.
func (s *Store) ReplayPending() uint64 { return s.m.Pending }

// ReplayRate is the replay's rate in letters per second (0: none running).
func (s *Store) ReplayRate() uint64 {
	if s.m.Pending == 0 {
		return 0
	}
	return s.m.ReplayRate
}

func keyIndex(key string, id uint64) []byte {
	k := binary.AppendUvarint(nil, uint64(len(key)))
	k = append(k, key...)
	return binary.BigEndian.AppendUint64(k, id)
}

// Add stores l under a new id and returns the id.
func (s *Store) Add(l *Letter) (uint64, error) {
	l.ID = s.m.NextID
	s.m.NextID++
	s.m.Count++
	if err := s.bucket(bktLetters).Put(mlog.U64Key(l.ID), l.encode()); err != nil {
		return 0, err
	}
	if k := l.Msg.IdempotencyKey; k != "" {
		if err := s.bucket(bktByKey).Put(keyIndex(k, l.ID), nil); err != nil {
			return 0, err
		}
	}
	return l.ID, s.save()
}

// Get returns letter id.
func (s *Store) Get(id uint64) (*Letter, error) {
	b := s.bucket(bktLetters)
	if b == nil {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	v := b.Get(mlog.U64Key(id))
	if v == nil {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	return decodeLetter(id, v)
}

// Delete removes letter id (and its place in the replay queue).
func (s *Store) Delete(id uint64) (*Letter, error) {
	l, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if err := s.bucket(bktLetters).Delete(mlog.U64Key(id)); err != nil {
		return nil, err
	}
	if k := l.Msg.IdempotencyKey; k != "" {
		if err := s.bucket(bktByKey).Delete(keyIndex(k, id)); err != nil {
			return nil, err
		}
	}
	if s.queued(id) {
		if err := s.bucket(bktReplay).Delete(mlog.U64Key(id)); err != nil {
			return nil, err
		}
		s.m.Pending--
	}
	s.m.Count--
	return l, s.save()
}

// List returns up to limit letters with id > after, oldest first; with a
// key, only letters whose message carries that idempotency key.
func (s *Store) List(after uint64, limit int, key string) ([]*Letter, error) {
	var out []*Letter
	if key != "" {
		b := s.bucket(bktByKey)
		if b == nil {
			return nil, nil
		}
		prefix := keyIndex(key, 0)
		prefix = prefix[:len(prefix)-8]
		c := b.Cursor()
		for k, _ := c.Seek(keyIndex(key, after+1)); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
			if len(k) != len(prefix)+8 {
				continue
			}
			l, err := s.Get(binary.BigEndian.Uint64(k[len(prefix):]))
			if err != nil {
				return nil, err
			}
			out = append(out, l)
		}
		return out, nil
	}
	b := s.bucket(bktLetters)
	if b == nil {
		return nil, nil
	}
	c := b.Cursor()
	for k, v := c.Seek(mlog.U64Key(after + 1)); k != nil && len(out) < limit; k, v = c.Next() {
		l, err := decodeLetter(binary.BigEndian.Uint64(k), v)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// A letter is queued for replay when its id is at most ReplayAllTo (a
// "replay all" covers every letter that existed then) or when it is in the
// explicit queue, which only ever holds ids above ReplayAllTo. Pending
// counts the queued letters.

var queuedMark = []byte{1}

func (s *Store) queued(id uint64) bool {
	return id <= s.m.ReplayAllTo || s.bucket(bktReplay).Get(mlog.U64Key(id)) != nil
}

// QueueReplay queues letters for replay at rate per second: the given ids,
// or with all every letter stored now. It returns how many it newly queued.
func (s *Store) QueueReplay(ids []uint64, all bool, rate uint64) (uint64, error) {
	var n uint64
	if all {
		// Every letter above the old mark that is not explicitly queued yet;
		// the explicit queue is then subsumed by the new mark.
		c := s.bucket(bktLetters).Cursor()
		for k, _ := c.Seek(mlog.U64Key(s.m.ReplayAllTo + 1)); k != nil; k, _ = c.Next() {
			n++
		}
		var explicit [][]byte
		rc := s.bucket(bktReplay).Cursor()
		for k, _ := rc.First(); k != nil; k, _ = rc.Next() {
			explicit = append(explicit, bytes.Clone(k))
		}
		for _, k := range explicit {
			if err := s.bucket(bktReplay).Delete(k); err != nil {
				return 0, err
			}
		}
		n -= uint64(len(explicit))
		s.m.ReplayAllTo = s.m.NextID - 1
	} else {
		for _, id := range ids {
			if s.bucket(bktLetters).Get(mlog.U64Key(id)) == nil || s.queued(id) {
				continue
			}
			// A non-empty value: bbolt's Get answers nil for an empty one.
			if err := s.bucket(bktReplay).Put(mlog.U64Key(id), queuedMark); err != nil {
				return 0, err
			}
			n++
		}
	}
	s.m.Pending += n
	if n > 0 {
		s.m.ReplayRate = rate
	}
	return n, s.save()
}

// NextReplay returns up to max letters due for replay, lowest ids first,
// and removes them from the store; the caller puts them back into delivery
// and reports each with Replayed.
func (s *Store) NextReplay(max int) ([]*Letter, error) {
	var ids []uint64
	c := s.bucket(bktLetters).Cursor()
	for k, _ := c.First(); k != nil && len(ids) < max; k, _ = c.Next() {
		id := binary.BigEndian.Uint64(k)
		if id > s.m.ReplayAllTo {
			break
		}
		ids = append(ids, id)
	}
	rc := s.bucket(bktReplay).Cursor()
	for k, _ := rc.First(); k != nil && len(ids) < max; k, _ = rc.Next() {
		ids = append(ids, binary.BigEndian.Uint64(k))
	}
	out := make([]*Letter, 0, len(ids))
	for _, id := range ids {
		l, err := s.Delete(id)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// Replayed counts a letter put back into delivery; Skipped one whose
// message was no longer retained.
func (s *Store) Replayed(ok bool) error {
	if ok {
		s.m.Replayed++
	} else {
		s.m.Skipped++
	}
	return s.save()
}
