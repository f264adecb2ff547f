package dedup

import (
	"bytes"
	"encoding/binary"
	"fmt"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Kinds of index, the first byte of an expiry entry's namespace.
const (
	KindPublish   byte = 'p' // topic's idempotency keys
	KindProcessed byte = 'g' // keys a group has acked
	KindProducer  byte = 's' // producer sequence state
	KindOutcome   byte = 'o' // a group's process outcomes (from state format 3)
)

var bktExpiry = []byte("dedup_expiry")

// Init creates the root expiry index.
func Init(tx *bolt.Tx) error {
	_, err := tx.CreateBucketIfNotExists(bktExpiry)
	return err
}

// Index is one namespace of keys with expiry: a bucket whose values are
// expires(8, big endian) followed by a payload.
type Index struct {
	b   *bolt.Bucket
	exp *bolt.Bucket
	ns  []byte // kind + uvarint-prefixed topic + uvarint-prefixed group
}

func namespace(kind byte, topic, group string) []byte {
	var e mlog.Enc
	e.Byte(kind)
	e.Str(topic)
	e.Str(group)
	return e.B
}

// Open returns the index kept in bucket name under parent (created if
// missing when the transaction is writable).
func Open(tx *bolt.Tx, parent *bolt.Bucket, name []byte, kind byte, topic, group string) (*Index, error) {
	b := parent.Bucket(name)
	if b == nil {
		if !tx.Writable() {
			return &Index{exp: tx.Bucket(bktExpiry), ns: namespace(kind, topic, group)}, nil
		}
		var err error
		if b, err = parent.CreateBucket(name); err != nil {
			return nil, fmt.Errorf("dedup bucket: %w", err)
		}
	}
	return &Index{b: b, exp: tx.Bucket(bktExpiry), ns: namespace(kind, topic, group)}, nil
}

// Get returns the payload stored under key if it has not expired at now.
// The payload aliases the transaction's memory.
func (ix *Index) Get(key []byte, now int64) ([]byte, bool) {
	if ix.b == nil {
		return nil, false
	}
	v := ix.b.Get(key)
	if len(v) < 8 || int64(binary.BigEndian.Uint64(v)) <= now {
		return nil, false
	}
	return v[8:], true
}

// Put stores payload under key until expires, replacing any entry.
func (ix *Index) Put(key, payload []byte, expires int64) error {
	if old := ix.b.Get(key); len(old) >= 8 {
		if err := ix.exp.Delete(ix.expiryKey(int64(binary.BigEndian.Uint64(old)), key)); err != nil {
			return err
		}
	}
	v := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint64(v, uint64(expires))
	copy(v[8:], payload)
	if err := ix.b.Put(key, v); err != nil {
		return err
	}
	return ix.exp.Put(ix.expiryKey(expires, key), nil)
}

// SetPayload replaces the payload of key's live entry, keeping its expiry
// (and its place in the expiry index); a missing key is left missing.
func (ix *Index) SetPayload(key, payload []byte) error {
	if ix.b == nil {
		return nil
	}
	old := ix.b.Get(key)
	if len(old) < 8 {
		return nil
	}
	v := make([]byte, 8+len(payload))
	copy(v, old[:8])
	copy(v[8:], payload)
	return ix.b.Put(key, v)
}

// Delete removes key.
func (ix *Index) Delete(key []byte) error {
	if ix.b == nil {
		return nil
	}
	old := ix.b.Get(key)
	if len(old) < 8 {
		return nil
	}
	if err := ix.exp.Delete(ix.expiryKey(int64(binary.BigEndian.Uint64(old)), key)); err != nil {
		return err
	}
	return ix.b.Delete(key)
}

func (ix *Index) expiryKey(expires int64, key []byte) []byte {
	k := make([]byte, 0, 8+len(ix.ns)+len(key))
	k = binary.BigEndian.AppendUint64(k, uint64(expires))
	k = append(k, ix.ns...)
	return append(k, key...)
}

// Due is one expiry entry that is due.
type Due struct {
	Expires      int64
	Kind         byte
	Topic, Group string
	Key          []byte
}

// DueEntries lists up to limit expiry entries due at now, oldest first.
func DueEntries(tx *bolt.Tx, now int64, limit int) ([]Due, error) {
	var out []Due
	c := tx.Bucket(bktExpiry).Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if len(k) < 9 {
			return nil, fmt.Errorf("%w: short dedup expiry key", mlog.ErrCorrupt)
		}
		at := int64(binary.BigEndian.Uint64(k))
		if at > now {
			break
		}
		d := mlog.Dec{B: k[9:]}
		e := Due{Expires: at, Kind: k[8], Topic: d.Str(), Group: d.Str()}
		if err := d.Err(); err != nil {
			return nil, err
		}
		e.Key = bytes.Clone(d.B)
		out = append(out, e)
	}
	return out, nil
}

// HasDue reports whether any entry is due at now.
func HasDue(tx *bolt.Tx, now int64) bool {
	k, _ := tx.Bucket(bktExpiry).Cursor().First()
	return k != nil && int64(binary.BigEndian.Uint64(k)) <= now
}

// DropExpiry removes one expiry entry (whose owner is gone).
func DropExpiry(tx *bolt.Tx, d Due) error {
	ix := Index{ns: namespace(d.Kind, d.Topic, d.Group)}
	return tx.Bucket(bktExpiry).Delete(ix.expiryKey(d.Expires, d.Key))
}

// ExpireEntry removes the entry d names if it still expires at d.Expires,
// and always removes the expiry entry itself.
func (ix *Index) ExpireEntry(d Due) error {
	if ix.b != nil {
		if v := ix.b.Get(d.Key); len(v) >= 8 && int64(binary.BigEndian.Uint64(v)) == d.Expires {
			if err := ix.b.Delete(d.Key); err != nil {
				return err
			}
		}
	}
	return ix.exp.Delete(ix.expiryKey(d.Expires, d.Key))
}
