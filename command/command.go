// Package command is the codec of the replicated commands: one Command per
// state change, its Op, and the versioned binary encoding raft's log holds.
// It is pure (no raft, no bbolt): the FSM decodes what the node encodes.
package command

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// Op is a command's operation. Zero is reserved; new ops are only appended.
type Op byte

// Operations.
const (
	OpInvalid Op = iota
	OpPutTopic
	OpDeleteTopic
	OpPublish
	OpLease
	OpAck
	OpExtend
	OpExpire
	OpPutGroup
	OpDeleteGroup
	OpTrim
	OpSetNode
	OpDedupExpire
	OpMulti
	OpNack
	OpReplay
	OpReplayStep
	OpDeleteDeadLetter
	OpSetFormat
	OpProcess     // from state format 3 (format.go)
	OpCreateGroup // from state format 4: the metadata group records a data group
	OpPlaceTopic  // from state format 4: the metadata group places a topic in a data group
	OpSetMembers  // from state format 4: the metadata group sets a data group's members (a move)
	opEnd         // one past the last op
)

func (o Op) String() string {
	names := [...]string{"invalid", "put_topic", "delete_topic", "publish", "lease", "ack", "extend",
		"expire", "put_group", "delete_group", "trim", "set_node", "dedup_expire", "multi",
		"nack", "replay", "replay_step", "delete_dead_letter", "set_format", "process",
		"create_group", "place_topic", "set_members"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", byte(o))
}

const codecVersion = 1

// NodeInfo is a cluster member's addresses, kept in the FSM so that every
// node can forward to the leader's HTTP address.
type NodeInfo struct {
	ID       string `json:"id"`
	HTTPAddr string `json:"http_addr"`
	RaftAddr string `json:"raft_addr"`
}

// Command is one replicated state change. Now is the leader's clock (unix
// ms) when it proposed the command; the FSM never reads a clock of its own.
// Only the fields of the command's Op are encoded.
type Command struct {
	Op       Op
	Now      int64
	Topic    string
	Group    string
	Patch    mlog.Patch      // OpPutTopic
	Msgs     []mlog.Placed   // OpPublish
	Producer string          // OpPublish: Mq-Producer-Id, or ""
	Seq      uint64          // OpPublish: the first message's producer sequence
	Max      uint32          // OpLease, OpDedupExpire
	LeaseMs  int64           // OpLease, OpExtend
	Receipts []group.Receipt // OpAck, OpExtend
	Expired  []group.Expired // OpExpire
	Node     NodeInfo        // OpSetNode
	Batch    []*Command      // OpMulti: independent commands in one log entry
	// Failures (OpNack, OpExpire): the leader's id for the history, a
	// random number per receipt for the jitter, and the nack's details.
	NodeID    string
	Rands     []uint32
	Reason    string
	Retryable bool
	DelayMs   int64    // -1: computed backoff
	IDs       []uint64 // OpReplay, OpDeleteDeadLetter: dead-letter ids
	All       bool     // OpReplay
	Rate      uint64   // OpReplay: letters per second
	Format    uint32   // OpSetFormat: the state format to switch to (format.go)
	Outputs   []Output // OpProcess: the messages to publish, with Receipts to ack
	// Members (OpCreateGroup, OpSetMembers): the node ids of data group
	// Group's replicas, the first the one that should lead it.
	Members []string
	// Replicas (OpCreateGroup): the replica count the group was placed
	// for; more than len(Members) when the cluster had fewer voters, and
	// the metadata leader then grows it as voters join (raftfsm/moves.go).
	Replicas int
}

// maxReplicas bounds a decoded OpCreateGroup's Replicas (the API allows
// 1, 3 or 5): a larger one is a corrupt entry.
const maxReplicas = 1 << 10

// Output is one message an OpProcess publishes, to any topic, placed on
// its partition by the leader.
type Output struct {
	Topic string
	mlog.Placed
}

// Encode renders the command in the versioned binary encoding.
func (c *Command) Encode() []byte {
	if c.Op == OpMulti {
		subs := make([][]byte, len(c.Batch))
		for i, sub := range c.Batch {
			subs[i] = sub.Encode()
		}
		return EncodeMulti(c.Now, subs)
	}
	e := mlog.Enc{B: make([]byte, 0, c.sizeHint())}
	c.encode(&e)
	return e.B
}

// encBufs holds command encodings the batcher has copied into an OpMulti
// entry: ApplyBatched encodes into one of them instead of a new buffer
// (about 1 KiB per small publish, 8 % of the leader's allocated bytes).
var encBufs sync.Pool

// maxPooledEnc is the largest buffer kept in encBufs: batch publishes of
// megabytes are rare enough to allocate, and would pin that much memory.
const maxPooledEnc = 16 << 10

// EncodePooled is Encode into a buffer from encBufs when one is large
// enough; buf, when not nil, is the buffer to give back (RecycleEnc) once
// enc is copied into an entry. An enc that becomes an entry itself is
// raft's and is never given back.
func (c *Command) EncodePooled() (enc []byte, buf *[]byte) {
	hint := c.sizeHint()
	if c.Op == OpMulti || hint > maxPooledEnc {
		return c.Encode(), nil
	}
	buf, _ = encBufs.Get().(*[]byte)
	if buf == nil || cap(*buf) < hint {
		buf = new([]byte)
		*buf = make([]byte, 0, hint)
	}
	e := mlog.Enc{B: (*buf)[:0]}
	c.encode(&e)
	*buf = e.B
	return e.B, buf
}

// RecycleEnc gives a buffer of EncodePooled back to encBufs; nothing may
// use its encoding after.
func RecycleEnc(buf *[]byte) {
	if buf != nil && cap(*buf) <= maxPooledEnc {
		encBufs.Put(buf)
	}
}

// EncodeMulti is the OpMulti encoding of commands already encoded (the
// batcher's commands are encoded by their callers).
func EncodeMulti(now int64, subs [][]byte) []byte {
	n := 16
	for _, s := range subs {
		n += len(s) + binary.MaxVarintLen32
	}
	e := mlog.Enc{B: make([]byte, 0, n)}
	e.Byte(codecVersion)
	e.Byte(byte(OpMulti))
	e.I64(now)
	e.U64(uint64(len(subs)))
	for _, s := range subs {
		e.Bytes(s)
	}
	return e.B
}

// sizeHint is about the encoded size (more for most commands), so that
// Encode allocates its buffer once: a batch of messages is megabytes.
func (c *Command) sizeHint() int {
	n := 64 + len(c.Topic) + len(c.Group) + len(c.Producer) + len(c.NodeID) + len(c.Reason) +
		30*len(c.Receipts) + 10*(len(c.IDs)+len(c.Rands))
	for _, m := range c.Members {
		n += 10 + len(m)
	}
	for _, x := range c.Expired {
		n += 40 + len(x.Topic) + len(x.Group)
	}
	for _, m := range c.Msgs {
		n += placedSize(m)
	}
	for _, o := range c.Outputs {
		n += 8 + len(o.Topic) + placedSize(o.Placed)
	}
	return n
}

func placedSize(m mlog.Placed) int {
	n := 80 + len(m.Msg.Value) + len(m.Msg.IdempotencyKey)
	for _, a := range m.Msg.Attrs {
		n += 20 + len(a.Name) + len(a.Value)
	}
	return n
}

// encode appends any command but OpMulti (Encode frames those).
func (c *Command) encode(e *mlog.Enc) {
	e.Byte(codecVersion)
	e.Byte(byte(c.Op))
	e.I64(c.Now)
	switch c.Op {
	case OpPutTopic:
		e.Str(c.Topic)
		c.Patch.Encode(e)
	case OpDeleteTopic, OpTrim:
		e.Str(c.Topic)
	case OpPutGroup, OpDeleteGroup:
		e.Str(c.Topic)
		e.Str(c.Group)
	case OpPublish:
		e.Str(c.Topic)
		e.Str(c.Producer)
		e.U64(c.Seq)
		e.U64(uint64(len(c.Msgs)))
		for _, m := range c.Msgs {
			e.U64(uint64(m.Partition))
			m.Msg.Encode(e)
		}
	case OpDedupExpire:
		e.U64(uint64(c.Max))
	case OpLease:
		e.Str(c.Topic)
		e.Str(c.Group)
		e.U64(uint64(c.Max))
		e.I64(c.LeaseMs)
	case OpAck, OpExtend:
		e.Str(c.Topic)
		e.Str(c.Group)
		e.I64(c.LeaseMs)
		encodeReceipts(e, c.Receipts)
	case OpExpire:
		e.U64(uint64(len(c.Expired)))
		for _, x := range c.Expired {
			e.Str(x.Topic)
			e.Str(x.Group)
			encodeReceipts(e, []group.Receipt{x.Receipt})
		}
		e.Str(c.NodeID)
		encodeRands(e, c.Rands)
	case OpNack:
		e.Str(c.Topic)
		e.Str(c.Group)
		encodeReceipts(e, c.Receipts)
		e.Str(c.NodeID)
		encodeRands(e, c.Rands)
		e.Str(c.Reason)
		e.Bool(c.Retryable)
		e.I64(c.DelayMs)
	case OpReplay, OpReplayStep, OpDeleteDeadLetter:
		e.Str(c.Topic)
		e.Str(c.Group)
		e.U64(uint64(len(c.IDs)))
		for _, id := range c.IDs {
			e.U64(id)
		}
		e.Bool(c.All)
		e.U64(c.Rate)
		e.U64(uint64(c.Max))
	case OpSetNode:
		e.Str(c.Node.ID)
		e.Str(c.Node.HTTPAddr)
		e.Str(c.Node.RaftAddr)
	case OpSetFormat:
		e.U64(uint64(c.Format))
	case OpProcess:
		e.Str(c.Topic)
		e.Str(c.Group)
		encodeReceipts(e, c.Receipts)
		e.U64(uint64(len(c.Outputs)))
		for _, o := range c.Outputs {
			e.Str(o.Topic)
			e.U64(uint64(o.Partition))
			o.Msg.Encode(e)
		}
	case OpCreateGroup, OpSetMembers:
		e.Str(c.Group)
		e.U64(uint64(len(c.Members)))
		for _, m := range c.Members {
			e.Str(m)
		}
		if c.Op == OpCreateGroup {
			e.U64(uint64(c.Replicas))
		}
	case OpPlaceTopic:
		e.Str(c.Topic)
		e.Str(c.Group)
	}
}

func encodeRands(e *mlog.Enc, rs []uint32) {
	e.U64(uint64(len(rs)))
	for _, r := range rs {
		e.U64(uint64(r))
	}
}

func decodeRands(d *mlog.Dec) []uint32 {
	n := d.Len(1)
	if n == 0 {
		return nil
	}
	rs := make([]uint32, n)
	for i := range rs {
		rs[i] = uint32(d.U64())
	}
	return rs
}

func encodeReceipts(e *mlog.Enc, rs []group.Receipt) {
	e.U64(uint64(len(rs)))
	for _, r := range rs {
		e.U64(uint64(r.Partition))
		e.U64(r.Offset)
		e.U64(r.Delivery)
	}
}

func decodeReceipts(d *mlog.Dec) []group.Receipt {
	n := d.Len(3)
	rs := make([]group.Receipt, n)
	for i := range rs {
		rs[i] = group.Receipt{Partition: uint32(d.U64()), Offset: d.U64(), Delivery: d.U64()}
	}
	return rs
}

// Decode reads what Encode wrote. Byte slices in the result alias b.
func Decode(b []byte) (*Command, error) {
	d := mlog.Dec{B: b}
	if v := d.Byte(); d.Err() == nil && v != codecVersion {
		return nil, fmt.Errorf("%w: command codec version %d", mlog.ErrCorrupt, v)
	}
	c := &Command{Op: Op(d.Byte()), Now: d.I64()}
	switch c.Op {
	case OpPutTopic:
		c.Topic = d.Str()
		c.Patch = mlog.DecodePatch(&d)
	case OpDeleteTopic, OpTrim:
		c.Topic = d.Str()
	case OpPutGroup, OpDeleteGroup:
		c.Topic, c.Group = d.Str(), d.Str()
	case OpPublish:
		c.Topic = d.Str()
		c.Producer = d.Str()
		c.Seq = d.U64()
		n := d.Len(9)
		c.Msgs = make([]mlog.Placed, n)
		for i := range c.Msgs {
			c.Msgs[i].Partition = uint32(d.U64())
			c.Msgs[i].Msg = mlog.DecodeMessage(&d)
		}
	case OpDedupExpire:
		c.Max = uint32(d.U64())
	case OpMulti:
		n := d.Len(4)
		c.Batch = make([]*Command, n)
		for i := range c.Batch {
			sub, err := Decode(d.Bytes())
			if err == nil && sub.Op == OpMulti {
				err = fmt.Errorf("%w: nested multi command", mlog.ErrCorrupt)
			}
			if err != nil {
				return nil, err
			}
			c.Batch[i] = sub
		}
	case OpLease:
		c.Topic, c.Group = d.Str(), d.Str()
		c.Max = uint32(d.U64())
		c.LeaseMs = d.I64()
	case OpAck, OpExtend:
		c.Topic, c.Group = d.Str(), d.Str()
		c.LeaseMs = d.I64()
		c.Receipts = decodeReceipts(&d)
	case OpExpire:
		n := d.Len(5)
		c.Expired = make([]group.Expired, n)
		for i := range c.Expired {
			x := &c.Expired[i]
			x.Topic, x.Group = d.Str(), d.Str()
			if rs := decodeReceipts(&d); len(rs) == 1 {
				x.Receipt = rs[0]
			} else if d.Err() == nil {
				return nil, fmt.Errorf("%w: expire item with %d receipts", mlog.ErrCorrupt, len(rs))
			}
		}
		c.NodeID = d.Str()
		c.Rands = decodeRands(&d)
	case OpNack:
		c.Topic, c.Group = d.Str(), d.Str()
		c.Receipts = decodeReceipts(&d)
		c.NodeID = d.Str()
		c.Rands = decodeRands(&d)
		c.Reason = d.Str()
		c.Retryable = d.Bool()
		c.DelayMs = d.I64()
	case OpReplay, OpReplayStep, OpDeleteDeadLetter:
		c.Topic, c.Group = d.Str(), d.Str()
		n := d.Len(1)
		if n > 0 {
			c.IDs = make([]uint64, n)
			for i := range c.IDs {
				c.IDs[i] = d.U64()
			}
		}
		c.All = d.Bool()
		c.Rate = d.U64()
		c.Max = uint32(d.U64())
	case OpSetNode:
		c.Node = NodeInfo{ID: d.Str(), HTTPAddr: d.Str(), RaftAddr: d.Str()}
	case OpSetFormat:
		c.Format = uint32(d.U64())
	case OpProcess:
		c.Topic, c.Group = d.Str(), d.Str()
		c.Receipts = decodeReceipts(&d)
		n := d.Len(10)
		c.Outputs = make([]Output, n)
		for i := range c.Outputs {
			o := &c.Outputs[i]
			o.Topic = d.Str()
			o.Partition = uint32(d.U64())
			o.Msg = mlog.DecodeMessage(&d)
		}
	case OpCreateGroup, OpSetMembers:
		c.Group = d.Str()
		n := d.Len(1)
		c.Members = make([]string, n)
		for i := range c.Members {
			c.Members[i] = d.Str()
		}
		if c.Op == OpCreateGroup {
			r := d.U64()
			if r > maxReplicas {
				return nil, fmt.Errorf("%w: %d replicas for group %s", mlog.ErrCorrupt, r, c.Group)
			}
			c.Replicas = int(r)
		}
	case OpPlaceTopic:
		c.Topic, c.Group = d.Str(), d.Str()
	default:
		if d.Err() == nil {
			return nil, fmt.Errorf("%w: unknown op %d", mlog.ErrCorrupt, c.Op)
		}
	}
	if err := d.Err(); err != nil {
		return nil, err
	}
	if len(d.B) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after %s", mlog.ErrCorrupt, len(d.B), c.Op)
	}
	return c, nil
}
