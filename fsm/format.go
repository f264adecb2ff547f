package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	bolt "go.etcd.io/bbolt"
)

// The replicated state format says which records the state may hold. It
// is part of the state (meta "state_format", written by OpSetFormat in the
// same transaction as everything else, so snapshots carry it), and it only
// rises: the leader raises it once every member of the cluster runs a
// binary that reads the new format (raftfsm/formatraise.go), because a binary that
// does not would misread the records, silently (a range lease record looks
// like acked messages to a binary without range records).
//
//   - 1: every state written before the format existed (no meta key).
//   - 2: leases of keyless messages may be kept as range records
//     (group.UseSpans); a lease stops at LeaseMaxBytes; a publish looks
//     a key up before it checks the message's size.
//   - 3: a lease takes new messages starting at the partition after the
//     last one the group's previous lease took one from (a group key,
//     group.RotatePartitions), not at its raft index mod partitions;
//     OpProcess (process.go) is applied, and keeps each call's outcome
//     (group "po"/"pr" buckets, dedup kind 'o'); a publish counts the
//     publishes answered as duplicates of a key in the key's index entry;
//     an ack of a keyed message records with the processed key which
//     message it was and its deliveries (group.TraceKeys). A binary
//     before format 3 cannot decode OpProcess and would expire a kind 'o'
//     entry as corrupt.
//   - 4: the metadata group keeps the directory of data groups
//     (directory.go): OpCreateGroup and OpPlaceTopic are applied. A binary
//     before format 4 cannot decode them, and would serve a placed topic
//     from the default group, which does not hold it.
//
// A format's rules are fixed once a release writes it
// (docs/ARCHITECTURE.md, State format).
const (
	// StateFormat is the highest format this binary reads and writes.
	StateFormat = 4
	// FormatUnset is the format of a state without the meta key.
	FormatUnset = 1
)

var keyFormat = []byte("state_format")

// storedFormat reads the state's format in tx.
func storedFormat(tx *bolt.Tx) int {
	if v := tx.Bucket(bktMeta).Get(keyFormat); len(v) == 8 {
		return int(binary.BigEndian.Uint64(v))
	}
	return FormatUnset
}

// errFormatTooNew: a committed OpSetFormat names a format this binary
// cannot read. It is not a refusal: the rest of the cluster switched, and
// a replica that went on in the old format would diverge from it, so the
// node stops (as it does on an entry it cannot decode).
var errFormatTooNew = errors.New("state format newer than this binary reads")

// applySetFormat raises the state's format to c.Format; a lower or equal
// one changes nothing (a retried raise is harmless). ev.format follows, so
// that the commands after it in the same batch see the new format.
func applySetFormat(tx *bolt.Tx, c *command.Command, ev *Events) error {
	want := int(c.Format)
	if want > StateFormat {
		return fmt.Errorf("%w: format %d, this binary reads up to %d", errFormatTooNew, want, StateFormat)
	}
	if want <= ev.format {
		return nil
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(want))
	if err := tx.Bucket(bktMeta).Put(keyFormat, v[:]); err != nil {
		return err
	}
	ev.format = want
	return nil
}

// LeaseMaxBytes bounds a lease (a fetch's answer) from state format 2: it
// stops adding messages once their stored records hold this many bytes,
// so a fetch of up to 1000 messages of up to 16 MiB cannot make the
// leader copy and encode gigabytes for one answer. The first message is
// leased whatever its size.
const LeaseMaxBytes = 8 << 20

// useSpans switches a group to range lease records; a variable so that
// tests see which leases were applied with it.
var useSpans = (*group.Group).UseSpans

// StateFormat is the replicated state's format as of the last applied
// batch (or open, or restore).
func (f *FSM) StateFormat() int { return int(f.format.Load()) }
