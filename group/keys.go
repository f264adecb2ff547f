package group

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/mqd/mqd/dedup"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Consumer-group idempotency: a group that acked a message with key K is
// not handed another message with K within the topic's dedup window, and
// while one message with K is leased no other message with K is delivered.

func (g *Group) processedIndex() (*dedup.Index, error) {
	return dedup.Open(g.tx, g.b, bktDone, dedup.KindProcessed, g.log.Topic, g.Name)
}

// processed reports whether the group acked a message with key within the
// window.
func (g *Group) processed(key string, now int64) bool {
	ix, err := g.processedIndex()
	if err != nil {
		return false
	}
	_, ok := ix.Get([]byte(key), now)
	return ok
}

// leasedByOther reports whether a message other than (p, off) holds key.
func (g *Group) leasedByOther(key string, p uint32, off uint64) bool {
	v := g.b.Bucket(bktLeasedBy).Get([]byte(key))
	return v != nil && !bytes.Equal(v, stateKey(p, off))
}

// keyDone records an ack of a message with key: the key is processed for
// the window (with trace, from state format 3, saying which message and
// how its deliveries went), and the messages held behind it are skipped as
// duplicates.
func (g *Group) keyDone(key string, now int64, trace []byte) error {
	if key == "" {
		return nil
	}
	window := g.log.Cfg.DedupWindowMs
	if window > 0 {
		ix, err := g.processedIndex()
		if err != nil {
			return err
		}
		if err := ix.Put([]byte(key), trace, now+window); err != nil {
			return err
		}
	}
	return g.releaseHeld(key, now, window > 0)
}

// releaseHeld ends the wait of the messages held behind key: as skipped
// duplicates, or back to the ready index to contend for the key again.
func (g *Group) releaseHeld(key string, now int64, asDuplicates bool) error {
	if key == "" {
		return nil
	}
	prefix := binary.AppendUvarint(nil, uint64(len(key)))
	prefix = append(prefix, key...)
	var held [][]byte
	c := g.b.Bucket(bktHeld).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+12; k, _ = c.Next() {
		held = append(held, bytes.Clone(k[len(prefix):]))
	}
	for _, sk := range held {
		p, off := binary.BigEndian.Uint32(sk), binary.BigEndian.Uint64(sk[4:])
		r, ok, err := g.getRecord(p, off)
		if err != nil {
			return err
		}
		if !ok || r.State != stateHeld {
			return errCorruptIndex(p, off)
		}
		if asDuplicates {
			g.c.DupSkipped++
			if err := g.remove(p, off, r); err != nil {
				return err
			}
			continue
		}
		nr := r
		nr.State, nr.Until = stateReady, now
		if err := g.replace(p, off, r, nr); err != nil {
			return err
		}
	}
	return nil
}

// ExpireProcessed removes a processed key whose window has passed.
func ExpireProcessed(tx *bolt.Tx, l *mlog.Log, d dedup.Due) error {
	g, err := Open(tx, l, d.Group, false, 0)
	if errors.Is(err, ErrGroupNotFound) {
		return dedup.DropExpiry(tx, d)
	}
	if err != nil {
		return err
	}
	ix, err := g.processedIndex()
	if err != nil {
		return err
	}
	return ix.ExpireEntry(d)
}
