package fsm

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// The directory is the metadata group's record of the data groups (SPEC
// section 12, docs/ARCHITECTURE.md "Several Raft groups"): each data
// group's members, and the group each topic placed since state format 4
// lives in. A topic the directory does not name lives in the default
// group, as every topic did before. Only the default group's state holds
// a directory; a data group's stays without the bucket.
//
// Keys of bucket "directory": "g" + group id → its generation (0 when
// created, one more at each OpSetMembers) and the members' ids (the first
// the one that should lead); "t" + topic → group id; "w" + group id → the
// number of members the group should grow back to (8 bytes), written only
// by a restore (RestoreDirectory), which leaves each group one member.

// DirectoryFormat is the state format from which OpCreateGroup and
// OpPlaceTopic are applied.
const DirectoryFormat = 4

var (
	bktDirectory = []byte("directory")

	// ErrGroupUnknown: a topic was placed in a group the directory does
	// not hold.
	ErrGroupUnknown = refusal.New(409, "group_unknown", "no such data group")
	// ErrGroupMembers: a data group was recorded again with other
	// members, or with none.
	ErrGroupMembers = refusal.New(409, "group_members", "a data group's members are fixed when it is created and cannot be empty")
	// ErrTopicPlaced: the metadata group was to create, in its own state,
	// a topic its directory places in a data group. Two creations of one
	// name raced with the raise to format 4: one was sent to the default
	// group before it, the other placed the topic after it. Retried, the
	// request goes to the data group.
	ErrTopicPlaced = refusal.New(503, "topic_placed",
		"the topic was placed in a data group while this request was creating it in the default group; retry")
)

// Directory is the directory as of some applied index: a value the caller
// must not change.
type Directory struct {
	// Groups: data group id → members, the preferred leader first: the
	// replicas the group should have (its leader moves its raft
	// configuration towards them: raftfsm/moves.go).
	Groups map[string][]string
	// Moved: the groups whose members were set since their creation
	// (OpSetMembers). A member of a group that never moved bootstraps it
	// with the members when it has no state; in one that moved, a new
	// member waits for the leader to add it.
	Moved map[string]bool
	// Topics: topic → data group id, for the topics placed in one.
	Topics map[string]string
	// Want: data group id → the members it should have: the replica
	// count it was created for (OpCreateGroup's Replicas; more than its
	// members when the cluster had fewer voters), or for a restored
	// group the members it had. Whenever it has fewer (created small, a
	// restore, a removed node no other could replace) the metadata leader
	// adds voters as they join (raftfsm/moves.go). Absent: its members.
	Want map[string]int
}

// GroupOf is the data group topic lives in, or "" for the default group.
func (d *Directory) GroupOf(topic string) string { return d.Topics[topic] }

// Counts is the number of topics placed in each data group.
func (d *Directory) Counts() map[string]int {
	out := make(map[string]int, len(d.Groups))
	for g := range d.Groups {
		out[g] = 0
	}
	for _, g := range d.Topics {
		out[g]++
	}
	return out
}

// dirCache is the directory as read at generation gen.
type dirCache struct {
	gen uint64
	dir *Directory
}

// Directory returns the directory, read anew only when a batch that
// changed it (or a restore) moved dirGen since the cached read (as
// nodeAddrs does for the nodes bucket).
func (f *FSM) Directory() *Directory {
	gen := f.dirGen.Load()
	if c := f.dir.Load(); c != nil && c.gen == gen {
		return c.dir
	}
	d := &Directory{Groups: map[string][]string{}, Moved: map[string]bool{}, Topics: map[string]string{}, Want: map[string]int{}}
	_ = f.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktDirectory)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) < 2 {
				return nil
			}
			switch k[0] {
			case 'g':
				if gen, m, err := decodeMembers(v); err == nil {
					d.Groups[string(k[1:])] = m
					if gen > 0 {
						d.Moved[string(k[1:])] = true
					}
				}
			case 't':
				d.Topics[string(k[1:])] = string(v)
			case 'w':
				if len(v) == 8 {
					d.Want[string(k[1:])] = int(binary.BigEndian.Uint64(v))
				}
			}
			return nil
		})
	})
	f.dir.Store(&dirCache{gen: gen, dir: d})
	return d
}

// OnDirectory sets the function called after every applied batch that
// changed the directory and after every restore (from raft's apply
// goroutine: it must not block).
func (f *FSM) OnDirectory(fn func()) { f.dirNotify.Store(&fn) }

func (f *FSM) directoryChanged() {
	f.dirGen.Add(1)
	if fn := f.dirNotify.Load(); fn != nil {
		(*fn)()
	}
}

func encodeMembers(gen uint64, ms []string) []byte {
	var e mlog.Enc
	e.U64(gen)
	e.U64(uint64(len(ms)))
	for _, m := range ms {
		e.Str(m)
	}
	return e.B
}

func decodeMembers(b []byte) (uint64, []string, error) {
	d := mlog.Dec{B: b}
	gen := d.U64()
	ms := make([]string, d.Len(1))
	for i := range ms {
		ms[i] = d.Str()
	}
	return gen, ms, d.Err()
}

// applyCreateGroup records data group c.Group with c.Members. Recording
// it again with the same members changes nothing (a retried proposal).
func applyCreateGroup(tx *bolt.Tx, c *command.Command, ev *Events) error {
	if ev.format < DirectoryFormat {
		return fmt.Errorf("%w (it is %d; data groups need %d)", ErrFormatTooOld, ev.format, DirectoryFormat)
	}
	if c.Group == "" || len(c.Members) == 0 {
		return fmt.Errorf("%w: group %q", ErrGroupMembers, c.Group)
	}
	b, err := tx.CreateBucketIfNotExists(bktDirectory)
	if err != nil {
		return err
	}
	key := append([]byte{'g'}, c.Group...)
	if v := b.Get(key); v != nil {
		if _, had, err := decodeMembers(v); err == nil && slices.Equal(had, c.Members) {
			return nil
		}
		return fmt.Errorf("%w: group %s exists with other members", ErrGroupMembers, c.Group)
	}
	ev.DirectoryChanged = true
	if c.Replicas > 1 {
		if err := b.Put(append([]byte{'w'}, c.Group...), binary.BigEndian.AppendUint64(nil, uint64(c.Replicas))); err != nil {
			return err
		}
	}
	return b.Put(key, encodeMembers(0, c.Members))
}

// WantOf is the number of members data group g should have: its Want, or
// as many as it has.
func (d *Directory) WantOf(g string) int { return max(d.Want[g], len(d.Groups[g])) }

// applySetMembers sets the members of data group c.Group (a move, a
// drain, a rebalance); the same members again change nothing.
func applySetMembers(tx *bolt.Tx, c *command.Command, ev *Events) error {
	if ev.format < DirectoryFormat {
		return fmt.Errorf("%w (it is %d; data groups need %d)", ErrFormatTooOld, ev.format, DirectoryFormat)
	}
	if len(c.Members) == 0 {
		return fmt.Errorf("%w: group %q", ErrGroupMembers, c.Group)
	}
	b := tx.Bucket(bktDirectory)
	key := append([]byte{'g'}, c.Group...)
	var v []byte
	if b != nil {
		v = b.Get(key)
	}
	if v == nil {
		return fmt.Errorf("%w: %s", ErrGroupUnknown, c.Group)
	}
	gen, had, err := decodeMembers(v)
	if err != nil {
		return fmt.Errorf("directory: group %s: %w", c.Group, err)
	}
	if slices.Equal(had, c.Members) {
		return nil
	}
	ev.DirectoryChanged = true
	return b.Put(key, encodeMembers(gen+1, c.Members))
}

// applyPlaceTopic places c.Topic in data group c.Group, unless the topic
// is placed already, or exists in this (the default) group: a topic never
// moves between groups, so the result names the group it is in
// (Result.Group, "" for the default group).
func applyPlaceTopic(tx *bolt.Tx, c *command.Command, ev *Events) (*Result, error) {
	if ev.format < DirectoryFormat {
		return nil, fmt.Errorf("%w (it is %d; data groups need %d)", ErrFormatTooOld, ev.format, DirectoryFormat)
	}
	b := tx.Bucket(bktDirectory)
	if b == nil || b.Get(append([]byte{'g'}, c.Group...)) == nil {
		return nil, fmt.Errorf("%w: %s", ErrGroupUnknown, c.Group)
	}
	key := append([]byte{'t'}, c.Topic...)
	if v := b.Get(key); v != nil {
		return &Result{Group: string(v)}, nil
	}
	if _, err := mlog.TopicBucket(tx, c.Topic); err == nil {
		return &Result{}, nil // created here before the raise to format 4
	}
	ev.DirectoryChanged = true
	return &Result{Group: c.Group, Created: true}, b.Put(key, []byte(c.Group))
}

// checkNotPlaced refuses the creation of topic in this state when the
// directory places it in a data group (ErrTopicPlaced). Only the metadata
// group's state has a directory; a data group's has none.
func checkNotPlaced(tx *bolt.Tx, topic string) error {
	b := tx.Bucket(bktDirectory)
	if b == nil || b.Get(append([]byte{'t'}, topic...)) == nil {
		return nil
	}
	if _, err := mlog.TopicBucket(tx, topic); err == nil {
		return nil // an update: a topic held here is never placed (applyPlaceTopic)
	}
	return fmt.Errorf("%w: %s", ErrTopicPlaced, topic)
}
