package fsm

import (
	"fmt"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Refusals of OpProcess.
var (
	// ErrStaleReceipt: a receipt of a process call is stale or invalid;
	// the whole call is refused (Result.Statuses says which).
	ErrStaleReceipt = refusal.New(409, "stale_receipt", "a receipt is stale or invalid: nothing was acked or published")
	// ErrFormatTooOld: the request needs a state format the cluster has
	// not reached: a member still runs an older binary, or a new cluster's
	// leader has not raised it yet (within a second of leading). A 503:
	// retried, it succeeds once the format is raised.
	ErrFormatTooOld = refusal.New(503, "state_format_too_old",
		"the cluster's state format is too old for this request: every member must run a binary that reads the format it needs")
)

// ProcessFormat is the state format from which OpProcess is applied.
const ProcessFormat = 3

// ProcessResult is what an OpProcess answered: how many receipts it acked
// and where each output went, in request order; Duplicate when it is the
// kept answer of an earlier call with the same receipts.
type ProcessResult struct {
	Acked     int
	Duplicate bool
	Outputs   []OutputPlacement
}

// OutputPlacement is one output's topic and placement.
type OutputPlacement struct {
	Topic string
	Published
}

// applyProcess acks the receipts of c's group and publishes c's outputs
// to their topics, all or nothing: every receipt and every output is
// checked (topic exists, size, duplicates, room) before the first write.
// A call whose receipts were acked by an earlier process call is answered
// with that call's kept outcome, changing nothing.
func applyProcess(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) (*Result, error) {
	if ev.format < ProcessFormat {
		return nil, fmt.Errorf("%w (it is %d)", ErrFormatTooOld, ev.format)
	}
	g, err := openGroup(tx, c, false, ev)
	if err != nil {
		return nil, err
	}
	st, err := g.Check(c.Now, idx, c.Receipts)
	if err != nil {
		return nil, err
	}
	if bad := notOK(st); bad > 0 || len(c.Receipts) == 0 {
		payload, ok, err := g.Outcome(c.Receipts, c.Now)
		if err != nil || !ok {
			if err == nil {
				err = fmt.Errorf("%w: %d of %d receipts", ErrStaleReceipt, bad, len(c.Receipts))
			}
			return &Result{Statuses: st}, err
		}
		pr, err := decodeProcessResult(payload)
		if err != nil {
			return nil, err
		}
		pr.Duplicate = true
		return &Result{Process: pr}, nil
	}
	plans, err := planOutputs(tx, c, ev)
	if err != nil {
		return nil, err
	}
	// Nothing was written so far; from here on nothing refuses.
	if _, err := g.Ack(c.Now, idx, c.Receipts); err != nil {
		return nil, err
	}
	pr := &ProcessResult{Acked: len(c.Receipts), Outputs: make([]OutputPlacement, len(c.Outputs))}
	for _, tp := range plans {
		if err := tp.plan.commit(tx, ev); err != nil {
			return nil, err
		}
		for j, i := range tp.idx {
			pr.Outputs[i] = OutputPlacement{Topic: tp.topic, Published: tp.plan.res[j]}
		}
	}
	in, err := mlog.Open(tx, c.Topic)
	if err != nil {
		return nil, err
	}
	if err := g.RecordOutcome(idx, c.Now, in.Cfg.DedupWindowMs, c.Receipts, len(c.Outputs), encodeProcessResult(pr)); err != nil {
		return nil, err
	}
	return &Result{Process: pr}, nil
}

// ProcessReceipts reads what a process call acking receipts rs of topic's
// group name would find at now, writing nothing: each receipt's status as
// applyProcess checks it, and whether an earlier call's kept outcome
// answers them (a repeat). group.ErrGroupNotFound and
// mlog.ErrTopicNotFound as the call would be refused.
func (r *Reader) ProcessReceipts(topic, name string, now int64, rs []group.Receipt) (st []string, repeat bool, err error) {
	l, err := mlog.Open(r.tx, topic)
	if err != nil {
		return nil, false, err
	}
	g, err := group.Open(r.tx, l, name, false, now)
	if err != nil {
		return nil, false, err
	}
	// A receipt's delivery is the index of the command that leased it:
	// below the next command's.
	if st, err = g.Check(now, r.AppliedIndex()+1, rs); err != nil || notOK(st) == 0 {
		return st, false, err
	}
	_, repeat, err = g.Outcome(rs, now)
	return st, repeat, err
}

func notOK(st []string) int {
	n := 0
	for _, s := range st {
		if s != group.StatusOK {
			n++
		}
	}
	return n
}

// topicPlan is the publish plan of the outputs to one topic; idx are
// their positions among the command's outputs.
type topicPlan struct {
	topic string
	idx   []int
	plan  *pubPlan
}

// planOutputs plans the outputs topic by topic, in the order each topic
// first appears, and refuses (writing nothing) when a topic is unknown, an
// output too large or a topic too full.
func planOutputs(tx *bolt.Tx, c *command.Command, ev *Events) ([]topicPlan, error) {
	var plans []topicPlan
	at := map[string]int{}
	for i, o := range c.Outputs {
		j, ok := at[o.Topic]
		if !ok {
			j = len(plans)
			at[o.Topic] = j
			plans = append(plans, topicPlan{topic: o.Topic})
		}
		plans[j].idx = append(plans[j].idx, i)
	}
	for j := range plans {
		tp := &plans[j]
		l, err := mlog.Open(tx, tp.topic)
		if err != nil {
			return nil, fmt.Errorf("output topic: %w", err)
		}
		msgs := make([]mlog.Placed, len(tp.idx))
		for k, i := range tp.idx {
			msgs[k] = c.Outputs[i].Placed
		}
		if tp.plan, err = planPublish(tx, l, msgs, c.Now, ev.format); err != nil {
			return nil, fmt.Errorf("output topic %q: %w", tp.topic, err)
		}
		if err := l.CheckRoom(tp.plan.n, tp.plan.size); err != nil {
			return nil, fmt.Errorf("output topic %q: %w", tp.topic, err)
		}
		ev.Touched = append(ev.Touched, tp.topic)
	}
	return plans, nil
}

// encodeProcessResult is the outcome kept for repeats: the acked count,
// the distinct output topics, and each output's topic (by number),
// placement and duplicate flag.
func encodeProcessResult(pr *ProcessResult) []byte {
	var e mlog.Enc
	e.U64(uint64(pr.Acked))
	var topics []string
	num := map[string]int{}
	for _, o := range pr.Outputs {
		if _, ok := num[o.Topic]; !ok {
			num[o.Topic] = len(topics)
			topics = append(topics, o.Topic)
		}
	}
	e.U64(uint64(len(topics)))
	for _, t := range topics {
		e.Str(t)
	}
	e.U64(uint64(len(pr.Outputs)))
	for _, o := range pr.Outputs {
		e.U64(uint64(num[o.Topic]))
		e.U64(uint64(o.Partition))
		e.U64(o.Offset)
		e.Bool(o.Duplicate)
	}
	return e.B
}

func decodeProcessResult(b []byte) (*ProcessResult, error) {
	d := mlog.Dec{B: b}
	pr := &ProcessResult{Acked: int(d.U64())}
	topics := make([]string, d.Len(1))
	for i := range topics {
		topics[i] = d.Str()
	}
	pr.Outputs = make([]OutputPlacement, d.Len(4))
	for i := range pr.Outputs {
		t := int(d.U64())
		if t >= len(topics) {
			return nil, fmt.Errorf("%w: process outcome names topic %d of %d", mlog.ErrCorrupt, t, len(topics))
		}
		pr.Outputs[i] = OutputPlacement{Topic: topics[t],
			Published: Published{Partition: uint32(d.U64()), Offset: d.U64(), Duplicate: d.Bool()}}
	}
	return pr, d.Err()
}
