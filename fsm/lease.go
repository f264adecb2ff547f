package fsm

import (
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// NeedsLease reports whether a fetch of the group at now must propose a
// lease: something is deliverable, or the group does not exist yet (a
// first fetch creates it). An unknown topic is mlog.ErrTopicNotFound.
func (r *Reader) NeedsLease(topic, name string, now int64) (bool, error) {
	return group.NeedsLease(r.tx, topic, name, now)
}

// FillLeased gives every delivery of a lease of topic that has no message
// its message, read from the current state, with MaxRetry resolved as a
// lease resolves it; a message no longer retained is left out (its lease
// went with it). A lease's result on the node that waits for it always
// carries its messages (FSM.AwaitLease), so this is a fallback that opens
// no read transaction when nothing is missing.
func (f *FSM) FillLeased(topic string, ds []group.Delivery) ([]group.Delivery, error) {
	missing := false
	for _, d := range ds {
		missing = missing || d.Msg == nil
	}
	if !missing {
		return ds, nil
	}
	var out []group.Delivery
	err := f.Read(func(r *Reader) error {
		var err error
		out, err = r.leasedMessages(topic, ds)
		return err
	})
	return out, err
}

func (r *Reader) leasedMessages(topic string, ds []group.Delivery) ([]group.Delivery, error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, err
	}
	out := make([]group.Delivery, 0, len(ds))
	for _, d := range ds {
		if d.Msg == nil {
			part, err := l.Partition(d.Partition)
			if err != nil {
				return nil, err
			}
			m, err := part.Get(d.Offset)
			if err != nil {
				return nil, err
			}
			if m == nil {
				continue
			}
			d.Msg = m.Clone() // m aliases the transaction's memory
			if d.Msg.MaxRetry < 0 {
				d.Msg.MaxRetry = l.Cfg.MaxRetry
			}
		}
		out = append(out, d)
	}
	return out, nil
}
