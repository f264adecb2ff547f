package api

import (
	"errors"
	"fmt"

	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

// processBody is the JSON of POST .../groups/{group}/process (SPEC §10).
type processBody struct {
	Ack     []string     `json:"ack"`
	Publish []processOut `json:"publish"`
}

// processOut is one output: a batch message with its topic.
type processOut struct {
	Topic string `json:"topic"`
	batchMsg
}

type processAnswer struct {
	Acked     int             `json:"acked"`
	Duplicate bool            `json:"duplicate"`
	Results   []publishAnswer `json:"results"`
}

// staleBody is a 409 stale_receipt: the error, and each receipt's status.
type staleBody struct {
	Error struct {
		Code     string          `json:"code"`
		Message  string          `json:"message"`
		Receipts []receiptResult `json:"receipts"`
	} `json:"error"`
}

// process acks the receipts and publishes the outputs as one command
// (fsm.applyProcess). The caller needs consume: on the input topic
// (the route) and publish: on every output topic, checked here before
// anything in the body is validated or looked up; a follower forwards the
// request and the leader authorizes the same caller again.
func (s *Server) process(ctx *fasthttp.RequestCtx, r *route) error {
	var b processBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	if err := s.authorizeOutputs(r, b.Publish); err != nil {
		return err
	}
	if foreign := s.foreignOutputs(b.Publish); len(foreign) > 0 {
		return s.processAcross(ctx, r, &b, foreign) // processacross.go
	}
	cmd, idx, err := s.processCommand(r, &b)
	if written, err := s.refuseProcess(ctx, b.Ack, err); written || err != nil {
		return err
	}
	res, err := s.node.ApplyBatched(r.ctx, cmd)
	if errors.Is(err, group.ErrGroupNotFound) || errors.Is(err, fsm.ErrStaleReceipt) {
		rr, serr := staleReceipts(err, r, b.Ack, idx, res)
		writeStale(ctx, serr, rr)
		return nil
	}
	if err != nil {
		return err
	}
	pr := res.Process
	out := processAnswer{Acked: pr.Acked, Duplicate: pr.Duplicate, Results: make([]publishAnswer, len(pr.Outputs))}
	for i, o := range pr.Outputs {
		out.Results[i] = publishAnswer{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, Duplicate: o.Duplicate}
	}
	if !pr.Duplicate {
		s.countProcess(pr)
	}
	writeJSON(ctx, 200, out)
	return nil
}

// authorizeOutputs: publish: on every output topic.
func (s *Server) authorizeOutputs(r *route, outs []processOut) error {
	if r.id == nil {
		return nil
	}
	for _, o := range outs {
		if !r.id.Allows(auth.Publish, o.Topic) {
			return fmt.Errorf("%w: token %q lacks publish:%s", ErrForbidden, r.id.Name(), o.Topic)
		}
	}
	return nil
}

// processCommand validates the body and builds the command: limits as for
// ack and batch publish, each output as a batch message, placed on its
// topic's partitions. A malformed receipt refuses the call (409) here;
// idx maps the command's receipts back to the request's.
func (s *Server) processCommand(r *route, b *processBody) (*command.Command, []int, error) {
	if len(b.Ack) == 0 || len(b.Ack) > maxReceipts {
		return nil, nil, fmt.Errorf("%w: ack must hold 1..%d receipts", ErrBadRequest, maxReceipts)
	}
	if len(b.Publish) > MaxBatchMessages {
		return nil, nil, fmt.Errorf("%w: %d outputs > %d", ErrBodyTooLarge, len(b.Publish), MaxBatchMessages)
	}
	if _, err := s.topicConfig(r.topic); err != nil {
		return nil, nil, err
	}
	cmd := &command.Command{Op: command.OpProcess, Now: nowMs(), Topic: r.topic, Group: r.group,
		Outputs: make([]command.Output, len(b.Publish))}
	seen := make(map[string]bool, len(b.Ack))
	bad := invalidReceipts{}
	idx := make([]int, 0, len(b.Ack))
	for i, rs := range b.Ack {
		if seen[rs] {
			return nil, nil, fmt.Errorf("%w: ack.%d repeats a receipt", ErrBadRequest, i)
		}
		seen[rs] = true
		rc, err := group.ParseReceipt(rs, r.topic, r.group)
		if err != nil {
			bad[rs] = true
			continue
		}
		cmd.Receipts = append(cmd.Receipts, rc)
		idx = append(idx, i)
	}
	if len(bad) > 0 {
		return nil, nil, bad
	}
	total := 0
	for i := range b.Publish {
		o, err := s.processOutput(&b.Publish[i], i)
		if err != nil {
			return nil, nil, err
		}
		total += len(o.Msg.Value)
		if total > MaxBatchBytes {
			return nil, nil, fmt.Errorf("%w: outputs total more than %d bytes", ErrBodyTooLarge, MaxBatchBytes)
		}
		cmd.Outputs[i] = o
	}
	return cmd, idx, s.node.CheckDisk(total)
}

// processOutput validates output i and places it on a partition of its
// topic. An unknown topic is a 404 and a message over the topic's
// max_message_bytes a 413 (unless it repeats a stored one by key, which
// the FSM answers as a duplicate), as for a batch publish.
func (s *Server) processOutput(o *processOut, i int) (command.Output, error) {
	if !mlog.ValidName(o.Topic) {
		return command.Output{}, fmt.Errorf("%w: publish.%d: topic %q must match [A-Za-z0-9._-]{1,200} and not be . or ..",
			mlog.ErrInvalidName, i, o.Topic)
	}
	m, err := o.toMsg(i)
	if err != nil {
		return command.Output{}, err
	}
	cfg, err := s.topicConfig(o.Topic)
	if err != nil {
		return command.Output{}, fmt.Errorf("publish.%d: output topic %q: %w", i, o.Topic, err)
	}
	if err := cfg.CheckSize(len(m.msg.Value)); err != nil && !s.repeatsStored(o.Topic, cfg, m, producer{}, 0) {
		return command.Output{}, fmt.Errorf("publish.%d: %w", i, err)
	}
	return command.Output{Topic: o.Topic, Placed: mlog.Placed{Partition: s.choosePartition(cfg.Partitions, m), Msg: m.msg}}, nil
}

// invalidReceipts are the receipts of a process call that mqd never
// issued (for this topic and group): the call is refused as stale.
type invalidReceipts map[string]bool

func (e invalidReceipts) Error() string {
	return fmt.Sprintf("%v: %d invalid receipts", fsm.ErrStaleReceipt, len(e))
}

func (e invalidReceipts) Unwrap() error { return fsm.ErrStaleReceipt }

// staleReceipts pairs the request's receipts (ack, of which the command
// holds those at idx) with their statuses in a refused call's result; a
// group that does not exist makes each one invalid, as in an ack.
func staleReceipts(err error, r *route, ack []string, idx []int, res *fsm.Result) ([]receiptResult, error) {
	var st []string
	if res != nil {
		st = res.Statuses
	}
	if errors.Is(err, group.ErrGroupNotFound) {
		err = fmt.Errorf("%w: group %q does not exist", fsm.ErrStaleReceipt, r.group)
		st = make([]string, len(idx))
		for i := range st {
			st[i] = group.StatusInvalid
		}
	}
	rr := make([]receiptResult, 0, len(idx))
	for j, i := range idx {
		if j < len(st) {
			rr = append(rr, receiptResult{Receipt: ack[i], Status: st[j]})
		}
	}
	return rr, err
}

// writeStale answers 409 stale_receipt naming the receipts not ok, with
// every receipt's status.
func writeStale(ctx *fasthttp.RequestCtx, err error, rr []receiptResult) {
	ae := classify(err)
	var b staleBody
	var named []string
	for _, x := range rr {
		if x.Status != group.StatusOK {
			named = append(named, x.Receipt)
		}
	}
	b.Error.Code, b.Error.Message, b.Error.Receipts = ae.code, fmt.Sprintf("%v: %q", err, named), rr
	writeJSON(ctx, ae.status, b)
}

// countProcess counts the call's acks and stored outputs on /metrics.
func (s *Server) countProcess(pr *fsm.ProcessResult) {
	ok := make([]string, pr.Acked)
	for i := range ok {
		ok[i] = group.StatusOK
	}
	s.metrics.countReceipts("process", ok)
	byTopic := map[string][]fsm.Published{}
	var order []string
	for _, o := range pr.Outputs {
		if _, seen := byTopic[o.Topic]; !seen {
			order = append(order, o.Topic)
		}
		byTopic[o.Topic] = append(byTopic[o.Topic], o.Published)
	}
	for _, t := range order {
		s.metrics.countPublished(t, byTopic[t])
	}
}

// refuseProcess answers a process call whose command could not be built
// (err from processCommand): 409 stale_receipt naming the invalid
// receipts, err itself, or 503 while the state format has no process. It
// reports whether it wrote the answer.
func (s *Server) refuseProcess(ctx *fasthttp.RequestCtx, acks []string, err error) (bool, error) {
	var inv invalidReceipts
	if errors.As(err, &inv) {
		rr := make([]receiptResult, len(acks))
		for i, rs := range acks {
			rr[i] = receiptResult{Receipt: rs, Status: group.StatusOK}
			if inv[rs] {
				rr[i].Status = group.StatusInvalid
			}
		}
		writeStale(ctx, err, rr)
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if s.state.StateFormat() < fsm.ProcessFormat {
		return false, fmt.Errorf("%w (it is %d)", fsm.ErrFormatTooOld, s.state.StateFormat())
	}
	return false, nil
}
