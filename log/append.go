package log

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Placed is a message with the partition the leader chose for it.
type Placed struct {
	Partition uint32
	Msg       *Message
}

// Trimmed reports messages removed from the head of a partition, so that
// consumer-group state below the new head can be dropped.
type Trimmed struct {
	Partition uint32
	NewFirst  uint64
}

// Log is one topic's log inside a write transaction.
type Log struct {
	Topic string
	Cfg   Config
	tb    *bolt.Bucket
	parts map[uint32]*Partition
}

// Open opens a topic's log inside tx.
func Open(tx *bolt.Tx, topic string) (*Log, error) {
	tb, err := TopicBucket(tx, topic)
	if err != nil {
		return nil, err
	}
	cfg, err := decodeConfig(tb.Get(keyCfg))
	if err != nil {
		return nil, err
	}
	return &Log{Topic: topic, Cfg: cfg, tb: tb, parts: map[uint32]*Partition{}}, nil
}

// Bucket is the topic's bucket.
func (l *Log) Bucket() *bolt.Bucket { return l.tb }

// Partition returns partition p (cached for the life of the Log).
func (l *Log) Partition(p uint32) (*Partition, error) {
	if p >= l.Cfg.Partitions {
		return nil, fmt.Errorf("%w: partition %d of %d", ErrInvalidConfig, p, l.Cfg.Partitions)
	}
	if part, ok := l.parts[p]; ok {
		return part, nil
	}
	part, err := openPartition(l.tb, p)
	if err != nil {
		return nil, err
	}
	l.parts[p] = part
	return part, nil
}

// Totals returns the retained message count and bytes over all partitions.
func (l *Log) Totals() (count, size uint64, err error) {
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		p, err := l.Partition(i)
		if err != nil {
			return 0, 0, err
		}
		count += p.Meta.Count()
		size += p.Meta.Bytes
	}
	return count, size, nil
}

// CheckSize reports ErrTooLarge for a payload over max_message_bytes.
func (l *Log) CheckSize(n int) error { return l.Cfg.CheckSize(n) }

// MakeRoom enforces max_messages and max_bytes before adding n messages of
// size bytes: under reject-publish it answers ErrTopicFull; under drop-head it
// trims the oldest messages (oldest head first across partitions) and reports
// what it trimmed.
func (l *Log) MakeRoom(n, size uint64) ([]Trimmed, error) {
	if err := l.CheckRoom(n, size); err != nil {
		return nil, err
	}
	if l.Cfg.MaxMessages == 0 && l.Cfg.MaxBytes == 0 {
		return nil, nil
	}
	count, bytes, err := l.Totals()
	if err != nil {
		return nil, err
	}
	over := func() bool {
		return (l.Cfg.MaxMessages > 0 && count+n > uint64(l.Cfg.MaxMessages)) ||
			(l.Cfg.MaxBytes > 0 && bytes+size > uint64(l.Cfg.MaxBytes))
	}
	if !over() {
		return nil, nil
	}
	trimmed := map[uint32]uint64{}
	for over() && count > 0 {
		p, err := l.oldestHead()
		if err != nil {
			return nil, err
		}
		before := p.Meta.Bytes
		if _, err := p.TrimTo(p.Meta.First + 1); err != nil {
			return nil, err
		}
		count--
		bytes -= before - p.Meta.Bytes
		trimmed[p.ID] = p.Meta.First
	}
	out := make([]Trimmed, 0, len(trimmed))
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		if f, ok := trimmed[i]; ok {
			out = append(out, Trimmed{Partition: i, NewFirst: f})
		}
	}
	return out, nil
}

// CheckRoom answers the ErrTopicFull that MakeRoom(n, size) would, without
// writing: a command publishing to several topics checks them all first.
func (l *Log) CheckRoom(n, size uint64) error {
	if l.Cfg.MaxMessages == 0 && l.Cfg.MaxBytes == 0 {
		return nil
	}
	count, bytes, err := l.Totals()
	if err != nil {
		return err
	}
	over := (l.Cfg.MaxMessages > 0 && count+n > uint64(l.Cfg.MaxMessages)) ||
		(l.Cfg.MaxBytes > 0 && bytes+size > uint64(l.Cfg.MaxBytes))
	if over && (l.Cfg.Overflow == OverflowReject || (l.Cfg.MaxMessages > 0 && n > uint64(l.Cfg.MaxMessages)) ||
		(l.Cfg.MaxBytes > 0 && size > uint64(l.Cfg.MaxBytes))) {
		return fmt.Errorf("%w: limit max_messages=%d max_bytes=%d", ErrTopicFull, l.Cfg.MaxMessages, l.Cfg.MaxBytes)
	}
	return nil
}

func (l *Log) oldestHead() (*Partition, error) {
	var best *Partition
	var bestT int64
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		p, err := l.Partition(i)
		if err != nil {
			return nil, err
		}
		t, ok, err := p.HeadTime()
		if err != nil {
			return nil, err
		}
		if ok && (best == nil || t < bestT) {
			best, bestT = p, t
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: no head to drop", ErrCorrupt)
	}
	return best, nil
}

// TrimOlderThanPlan says, without writing, how far each partition would be
// trimmed to drop the messages published before cutoff (unix ms).
func (l *Log) TrimOlderThanPlan(cutoff int64) ([]Trimmed, error) {
	var out []Trimmed
	for i := uint32(0); i < l.Cfg.Partitions; i++ {
		p, err := l.Partition(i)
		if err != nil {
			return nil, err
		}
		first := p.Meta.First
		c := p.msgs.Cursor()
		for k, v := c.Seek(U64Key(first)); k != nil; k, v = c.Next() {
			m, err := decodeMessage(v)
			if err != nil {
				return nil, err
			}
			if m.PublishedAt >= cutoff {
				break
			}
			first++
		}
		if first > p.Meta.First {
			out = append(out, Trimmed{Partition: i, NewFirst: first})
		}
	}
	return out, nil
}
