package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// ErrBadPartition: a browse names a partition the topic does not have.
var ErrBadPartition = errors.New("no such partition")

// Reader is one consistent view of the state machine (one bbolt read
// transaction) with typed getters, so that the HTTP layer does not depend
// on how the state is laid out in bbolt. It is valid only inside the
// function given to FSM.Read; what its getters answer does not point into
// the transaction and may be kept.
type Reader struct{ tx *bolt.Tx }

// Read runs fn with a Reader over the current state: everything fn reads
// comes from the same applied index.
func (f *FSM) Read(fn func(r *Reader) error) error {
	return f.View(func(tx *bolt.Tx) error { return fn(&Reader{tx: tx}) })
}

// AppliedIndex is the raft index of the last entry this view includes.
func (r *Reader) AppliedIndex() uint64 {
	if v := r.tx.Bucket(bktMeta).Get(keyApplied); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// TopicConfig answers a topic's configuration, or mlog.ErrTopicNotFound.
func (r *Reader) TopicConfig(topic string) (mlog.Config, error) {
	return mlog.GetConfig(r.tx, topic)
}

// Stored reports whether a publish to topic at now would repeat a stored
// message: its idempotency key is in the dedup window (key not empty), or
// its producer sequence is one of the producer's stored ones (producer not
// empty). The leader asks only for a message over the topic's
// max_message_bytes, which is refused unless it repeats its original.
func (r *Reader) Stored(topic, key, producer string, seq uint64, now int64) (bool, error) {
	if key != "" {
		if _, ok, err := lookupKey(r.tx, topic, key, now); ok || err != nil {
			return ok, err
		}
	}
	if producer == "" {
		return false, nil
	}
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return false, err
	}
	prod, err := dedup.OpenProducers(r.tx, l.Bucket(), topic)
	if err != nil {
		return false, err
	}
	return prod.Check(producer, seq, now).Verdict == dedup.SeqDuplicate, nil
}

// EachTopicAfter calls fn with each topic name that sorts after after, in
// order, until fn answers false (a page costs a seek, not a walk).
func (r *Reader) EachTopicAfter(after string, fn func(name string) bool) {
	mlog.EachTopicAfter(r.tx, after, fn)
}

// PartitionStats are one partition's offsets.
type PartitionStats struct {
	Partition               uint32
	FirstOffset, NextOffset uint64
	Messages                uint64
}

// TopicStats are a topic's configuration and live figures: its partitions
// and every group's Stats.
type TopicStats struct {
	Name            string
	Config          mlog.Config
	Messages, Bytes uint64
	Partitions      []PartitionStats
	Groups          map[string]group.Stats
}

// TopicStats computes a topic's figures at time now (unix ms); a group's
// Stats read its due messages, so this grows with what waits for a retry.
func (r *Reader) TopicStats(topic string, now int64) (*TopicStats, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	st := &TopicStats{Name: topic, Config: l.Cfg, Groups: map[string]group.Stats{}}
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		p, err := l.Partition(i)
		if err != nil {
			return nil, err
		}
		st.Partitions = append(st.Partitions, PartitionStats{i, p.Meta.First, p.Meta.Next, p.Meta.Count()})
		st.Messages += p.Meta.Count()
		st.Bytes += p.Meta.Bytes
	}
	for _, n := range group.Names(l) {
		g, err := group.Open(r.tx, l, n, false, now)
		if err != nil {
			return nil, err
		}
		if st.Groups[n], err = g.Stats(now); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// DeadLetters answers up to limit of a group's dead letters with an id
// above after, oldest first; with a key, only those whose message carries
// that idempotency key. Errors: mlog.ErrTopicNotFound,
// group.ErrGroupNotFound.
func (r *Reader) DeadLetters(topic, name string, after uint64, limit int, key string) ([]*dlq.Letter, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	g, err := group.Open(r.tx, l, name, false, 0)
	if err != nil {
		return nil, err
	}
	store, err := g.DeadLetters()
	if err != nil {
		return nil, err
	}
	return store.List(after, limit, key)
}

// LeaseOutlook tells a follower's long-poll what a fetch of the group at
// now would find: lease reports that it would lease something (a message
// is due or past the cursor) or create the group; otherwise due is when
// the group's next waiting message becomes due (zero: none waits). An
// error (a missing topic) is for the leader to answer.
func (r *Reader) LeaseOutlook(topic, name string, now int64) (lease bool, due time.Time, err error) {
	if _, err := mlog.GetConfig(r.tx, topic); err != nil {
		return false, due, err
	}
	if lease, err = group.NeedsLease(r.tx, topic, name, now); err != nil || lease {
		return lease, due, err
	}
	if at, has, err := group.NextDue(r.tx, topic, name, now); err == nil && has {
		due = time.UnixMilli(at)
	}
	return false, due, nil
}

// GroupGauges are one group's Gauges, with its name.
type GroupGauges struct {
	Name string
	group.Gauges
}

// TopicGauges are a topic's figures that its counters give without
// reading any message, with its groups' Gauges in name order.
type TopicGauges struct {
	Name            string
	Messages, Bytes uint64
	Groups          []GroupGauges
}

// EachTopicGauges calls fn with every topic's gauges, in name order:
// O(topics × groups × partitions), no message is read. The TopicGauges
// handed to fn is reused for the next topic: fn copies what it keeps. A
// topic or group whose figures cannot be read is left out.
func (r *Reader) EachTopicGauges(now int64, fn func(t *TopicGauges)) {
	var t TopicGauges
	mlog.EachTopicAfter(r.tx, "", func(name string) bool {
		l, err := mlog.Open(r.tx, name)
		if err != nil {
			return true
		}
		t = TopicGauges{Name: name, Groups: t.Groups[:0]}
		for i := uint32(0); i < l.Cfg.Partitions; i++ {
			if p, err := l.Partition(i); err == nil {
				t.Messages, t.Bytes = t.Messages+p.Meta.Count(), t.Bytes+p.Meta.Bytes
			}
		}
		for _, gn := range group.Names(l) {
			g, err := group.Open(r.tx, l, gn, false, now)
			if err != nil {
				continue
			}
			gs, err := g.Gauges()
			if err != nil {
				continue
			}
			t.Groups = append(t.Groups, GroupGauges{Name: gn, Gauges: gs})
		}
		fn(&t)
		return true
	})
}

// EachTopicTotals calls fn with every topic's retained messages and
// bytes, in name order, reading no group: O(topics × partitions), for a
// scrape without per-group series. A topic whose figures cannot be read
// is left out.
func (r *Reader) EachTopicTotals(fn func(name string, messages, bytes uint64)) {
	mlog.EachTopicAfter(r.tx, "", func(name string) bool {
		l, err := mlog.Open(r.tx, name)
		if err != nil {
			return true
		}
		var msgs, size uint64
		for i := uint32(0); i < l.Cfg.Partitions; i++ {
			if p, err := l.Partition(i); err == nil {
				msgs, size = msgs+p.Meta.Count(), size+p.Meta.Bytes
			}
		}
		fn(name, msgs, size)
		return true
	})
}

// BrowsePage is one page of Browse: the messages in (partition, offset)
// order, and the position right after the last one.
type BrowsePage struct {
	Messages []BrowsedMessage
	// NextPartition and NextOffset are where the next page starts.
	NextPartition uint32
	NextOffset    uint64
	// More reports that messages were stored past that position when
	// this page was read.
	More bool
}

// BrowsedMessage is one stored message and its position; Msg does not
// alias the transaction, and its MaxRetry is resolved (the topic's when
// the message set none).
type BrowsedMessage struct {
	Partition uint32
	Msg       *mlog.Message
}

// Browse reads up to limit stored messages of topic from (part, off) on,
// in offset order, moving on to the following partitions' first retained
// messages when a partition runs out unless only is set; it stops early
// once the values read reach maxBytes (after at least one message). An
// offset below a partition's first retained one starts at that one. It
// leases nothing and writes nothing. Errors: mlog.ErrTopicNotFound,
// ErrBadPartition.
func (r *Reader) Browse(topic string, part uint32, off uint64, limit, maxBytes int, only bool) (*BrowsePage, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	if part >= l.Cfg.Partitions {
		return nil, fmt.Errorf("%w: topic %s has partitions 0..%d, not %d", ErrBadPartition, topic, l.Cfg.Partitions-1, part)
	}
	pg := &BrowsePage{NextPartition: part, NextOffset: off}
	size := 0
	for {
		p, err := l.Partition(pg.NextPartition)
		if err != nil {
			return nil, err
		}
		pg.NextOffset = max(pg.NextOffset, p.Meta.First)
		sc := p.Scanner()
		for ; pg.NextOffset < p.Meta.Next; pg.NextOffset++ {
			if len(pg.Messages) >= limit || (len(pg.Messages) > 0 && size >= maxBytes) {
				pg.More = true
				return pg, nil
			}
			m, err := sc.Get(pg.NextOffset)
			if err != nil {
				return nil, err
			}
			if m == nil {
				continue
			}
			m = m.Clone()
			if m.MaxRetry < 0 {
				m.MaxRetry = l.Cfg.MaxRetry
			}
			size += len(m.Value)
			pg.Messages = append(pg.Messages, BrowsedMessage{Partition: pg.NextPartition, Msg: m})
		}
		if only || pg.NextPartition+1 >= l.Cfg.Partitions {
			return pg, nil
		}
		if len(pg.Messages) >= limit || size >= maxBytes {
			// Full at a partition's end: the next page starts at the next
			// partition, and there may be more there.
			next, err := l.Partition(pg.NextPartition + 1)
			if err != nil {
				return nil, err
			}
			pg.NextPartition, pg.NextOffset = pg.NextPartition+1, next.Meta.First
			pg.More, err = storedFrom(l, pg.NextPartition)
			return pg, err
		}
		pg.NextPartition, pg.NextOffset = pg.NextPartition+1, 0
	}
}

// storedFrom reports whether partition p or a later one holds a message.
func storedFrom(l *mlog.Log, p uint32) (bool, error) {
	for ; p < l.Cfg.Partitions; p++ {
		part, err := l.Partition(p)
		if err != nil {
			return false, err
		}
		if part.Meta.Count() > 0 {
			return true, nil
		}
	}
	return false, nil
}
