package fsm

import (
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// dispatch is the one switch from a command to the code that applies it.
func dispatch(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) (*Result, error) {
	switch c.Op {
	case command.OpPutTopic:
		if err := checkNotPlaced(tx, c.Topic); err != nil {
			return nil, err
		}
		ev.ConfigChanged = true
		created, err := mlog.PutTopic(tx, c.Topic, c.Patch)
		return &Result{Created: created}, err
	case command.OpDeleteTopic:
		ev.ConfigChanged = true
		return &Result{}, applyDeleteTopic(tx, c.Topic)
	case command.OpPublish:
		return applyPublish(tx, c, ev)
	case command.OpLease:
		return applyLease(tx, idx, c, ev)
	case command.OpAck, command.OpExtend:
		return applyReceipts(tx, idx, c, ev)
	case command.OpExpire:
		return &Result{}, applyExpire(tx, c, ev)
	case command.OpPutGroup:
		return applyPutGroup(tx, c)
	case command.OpDeleteGroup:
		l, err := mlog.Open(tx, c.Topic)
		if err != nil {
			return nil, err
		}
		return &Result{}, group.Delete(tx, l, c.Group)
	case command.OpTrim:
		return &Result{}, applyTrim(tx, c)
	case command.OpNack:
		return applyNack(tx, idx, c, ev)
	case command.OpReplay, command.OpReplayStep, command.OpDeleteDeadLetter:
		return applyDeadLetters(tx, c, ev)
	case command.OpDedupExpire:
		return &Result{}, applyDedupExpire(tx, c)
	case command.OpSetNode:
		ev.NodesChanged = true
		var e mlog.Enc
		e.Str(c.Node.HTTPAddr)
		e.Str(c.Node.RaftAddr)
		return &Result{}, tx.Bucket(bktNodes).Put([]byte(c.Node.ID), e.B)
	case command.OpSetFormat:
		return &Result{}, applySetFormat(tx, c, ev)
	case command.OpProcess:
		return applyProcess(tx, idx, c, ev)
	case command.OpCreateGroup:
		return &Result{}, applyCreateGroup(tx, c, ev)
	case command.OpPlaceTopic:
		return applyPlaceTopic(tx, c, ev)
	case command.OpSetMembers:
		return &Result{}, applySetMembers(tx, c, ev)
	}
	return &Result{}, nil
}

func applyDeleteTopic(tx *bolt.Tx, topic string) error {
	l, err := mlog.Open(tx, topic)
	if err != nil {
		return err
	}
	if err := group.DropTopicLeases(tx, l); err != nil {
		return err
	}
	return mlog.DeleteTopic(tx, topic)
}

func trimGroups(tx *bolt.Tx, l *mlog.Log, trimmed []mlog.Trimmed) error {
	if len(trimmed) == 0 {
		return nil
	}
	for _, name := range group.Names(l) {
		g, err := group.Open(tx, l, name, false, 0)
		if err != nil {
			return err
		}
		for _, t := range trimmed {
			if err := g.OnTrim(t); err != nil {
				return err
			}
		}
		if err := g.Save(); err != nil {
			return err
		}
	}
	return nil
}

func applyLease(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) (*Result, error) {
	g, err := openGroup(tx, c, true, ev)
	if err != nil {
		return nil, err
	}
	if ev.format >= 2 { // every member reads range records, and bounds leases in bytes
		useSpans(g)
		g.LimitLeaseBytes(LeaseMaxBytes)
	}
	if ev.format >= 3 { // every member starts a lease where the group's last one stopped
		g.RotatePartitions()
	}
	ds, err := g.Lease(c.Now, c.LeaseMs, int(c.Max), idx, ev.leaseMsgs)
	return &Result{Deliveries: ds}, err
}

func applyReceipts(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) (*Result, error) {
	g, err := openGroup(tx, c, false, ev)
	if err != nil {
		return nil, err
	}
	var st []string
	if c.Op == command.OpAck {
		st, err = g.Ack(c.Now, idx, c.Receipts)
	} else {
		st, err = g.Extend(c.Now, c.LeaseMs, idx, c.Receipts)
	}
	return &Result{Statuses: st}, err
}

func applyExpire(tx *bolt.Tx, c *command.Command, ev *Events) error {
	for i, x := range c.Expired {
		l, err := mlog.Open(tx, x.Topic)
		if err != nil {
			continue // deleted since the leader looked
		}
		g, err := group.Open(tx, l, x.Group, false, c.Now)
		if err != nil {
			continue
		}
		g.ReportTimers(&ev.Timers)
		g.ReportTally(ev)
		f := group.Failure{Failure: dlq.Failure{At: c.Now, Node: c.NodeID}, Rand: randAt(c.Rands, i)}
		if err := g.ExpireLease(x.Receipt, f); err != nil {
			return err
		}
		ev.wake(x.Topic)
	}
	return nil
}

func randAt(rs []uint32, i int) uint32 {
	if i < len(rs) {
		return rs[i]
	}
	return 0
}

func applyNack(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) (*Result, error) {
	g, err := openGroup(tx, c, false, ev)
	if err != nil {
		return nil, err
	}
	kind := dlq.KindNack
	if !c.Retryable {
		kind = dlq.KindRejected
	}
	fs := make([]group.Failure, len(c.Receipts))
	for i := range fs {
		fs[i] = group.Failure{Failure: dlq.Failure{At: c.Now, Kind: kind, Reason: c.Reason, Node: c.NodeID},
			Retryable: c.Retryable, DelayMs: c.DelayMs, Rand: randAt(c.Rands, i)}
	}
	st, err := g.Nack(c.Now, idx, c.Receipts, fs)
	ev.wake(c.Topic)
	return &Result{Statuses: st}, err
}

// openGroup opens the command's group (creating it when create is set),
// reporting the due times it creates into ev.
func openGroup(tx *bolt.Tx, c *command.Command, create bool, ev *Events) (*group.Group, error) {
	l, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return nil, err
	}
	g, err := group.Open(tx, l, c.Group, create, c.Now)
	if err != nil {
		return nil, err
	}
	g.ReportTimers(&ev.Timers)
	g.ReportTally(ev)
	if ev.format >= 3 { // acks keep what KeyState reports (process.go)
		g.TraceKeys()
	}
	return g, nil
}

func applyDeadLetters(tx *bolt.Tx, c *command.Command, ev *Events) (*Result, error) {
	g, err := openGroup(tx, c, false, ev)
	if err != nil {
		return nil, err
	}
	switch c.Op {
	case command.OpReplay:
		store, err := g.DeadLetters()
		if err != nil {
			return nil, err
		}
		n, err := store.QueueReplay(c.IDs, c.All, c.Rate)
		ev.Replays = append(ev.Replays, TopicGroup{c.Topic, c.Group})
		return &Result{Accepted: n}, err
	case command.OpReplayStep:
		n, err := g.ReplayStep(c.Now, int(c.Max))
		if n > 0 {
			ev.wake(c.Topic)
		}
		return &Result{Accepted: uint64(n)}, err
	default: // command.OpDeleteDeadLetter
		for _, id := range c.IDs {
			if err := g.DeleteDeadLetter(id); err != nil {
				return nil, err
			}
		}
		return &Result{}, nil
	}
}

func applyPutGroup(tx *bolt.Tx, c *command.Command) (*Result, error) {
	l, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return nil, err
	}
	_, err = group.Open(tx, l, c.Group, false, c.Now)
	if err == nil {
		return &Result{}, nil
	}
	_, err = group.Open(tx, l, c.Group, true, c.Now)
	return &Result{Created: err == nil}, err
}

// applyTrim enforces retention on one topic: retention_ms by age, or with
// retention_ms 0 and at least one group, everything every group finished.
func applyTrim(tx *bolt.Tx, c *command.Command) error {
	l, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return err
	}
	trimmed, err := TrimPlan(tx, l, c.Now)
	if err != nil {
		return err
	}
	for _, t := range trimmed {
		part, err := l.Partition(t.Partition)
		if err != nil {
			return err
		}
		if _, err := part.TrimTo(t.NewFirst); err != nil {
			return err
		}
	}
	return trimGroups(tx, l, trimmed)
}

// TrimPlan says what retention would trim from a topic at now, without
// writing. The leader calls it to decide whether to propose OpTrim.
func TrimPlan(tx *bolt.Tx, l *mlog.Log, now int64) ([]mlog.Trimmed, error) {
	var out []mlog.Trimmed
	if l.Cfg.RetentionMs > 0 {
		return l.TrimOlderThanPlan(now - l.Cfg.RetentionMs)
	}
	names := group.Names(l)
	if len(names) == 0 {
		return nil, nil
	}
	for p := uint32(0); p < l.Cfg.Partitions; p++ {
		part, err := l.Partition(p)
		if err != nil {
			return nil, err
		}
		floor := part.Meta.Next
		for _, n := range names {
			g, err := group.Open(tx, l, n, false, now)
			if err != nil {
				return nil, err
			}
			f, err := g.Floor(p)
			if err != nil {
				return nil, err
			}
			floor = min(floor, f)
		}
		if floor > part.Meta.First {
			out = append(out, mlog.Trimmed{Partition: p, NewFirst: floor})
		}
	}
	return out, nil
}
