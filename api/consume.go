package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
)

const (
	maxFetch    = 1000
	maxReceipts = 1000
	// recheckEvery bounds how late a long-poll notices a message that became
	// due without a commit to wake it (a delayed message, a retry).
	recheckEvery = 500 * time.Millisecond
)

type fetchBody struct {
	Max     *int64 `json:"max"`
	WaitMs  *int64 `json:"wait_ms"`
	LeaseMs *int64 `json:"lease_ms"`
}

type fetchedMessage struct {
	Topic          string            `json:"topic"`
	Partition      uint32            `json:"partition"`
	Offset         uint64            `json:"offset"`
	Receipt        string            `json:"receipt"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	RetryCount     uint32            `json:"retry_count"`
	MaxRetry       int64             `json:"max_retry"`
	RejectReason   string            `json:"reject_reason"`
	PublishedAt    string            `json:"published_at"`
	Attrs          map[string]string `json:"attrs"`
}

// fetchArgs are a fetch's validated body fields.
type fetchArgs struct {
	max, waitMs, leaseMs int64 // leaseMs 0: the topic's ack_timeout_ms
}

func parseFetch(body []byte) (fetchArgs, error) {
	var b fetchBody
	if err := optBody(body, &b); err != nil {
		return fetchArgs{}, err
	}
	fa := fetchArgs{max: 10}
	for _, f := range []struct {
		name   string
		v      *int64
		dst    *int64
		lo, hi int64
	}{{"max", b.Max, &fa.max, 1, maxFetch}, {"wait_ms", b.WaitMs, &fa.waitMs, 0, int64(maxWait / time.Millisecond)},
		{"lease_ms", b.LeaseMs, &fa.leaseMs, 1, 12 * 3600 * 1000}} {
		if f.v == nil {
			continue
		}
		if err := checkRange(f.name, *f.v, f.lo, f.hi); err != nil {
			return fetchArgs{}, err
		}
		*f.dst = *f.v
	}
	return fa, nil
}

// body is the fetch's JSON with wait_ms replaced by wait.
func (fa fetchArgs) body(wait time.Duration) []byte {
	b := fetchBody{Max: &fa.max, WaitMs: new(int64)}
	*b.WaitMs = max(0, wait.Milliseconds())
	if fa.leaseMs > 0 {
		b.LeaseMs = &fa.leaseMs
	}
	out, _ := json.Marshal(b)
	return out
}

func (s *Server) fetch(ctx *fasthttp.RequestCtx, r *route) error {
	fa, err := parseFetch(ctx.PostBody())
	if err != nil {
		return err
	}
	end := time.Now().Add(time.Duration(fa.waitMs) * time.Millisecond)
	parked := false
	defer func() {
		if parked {
			s.polls.Dec()
		}
	}()
	for {
		woken := s.waiters.wait(r.topic)
		msgs, err := s.tryLease(r, int(fa.max), fa.leaseMs)
		if err != nil || len(msgs) > 0 || !time.Now().Before(end) {
			if err != nil {
				return err
			}
			writeJSON(ctx, 200, map[string]any{"messages": msgs})
			return nil
		}
		if !parked {
			parked = true
			s.polls.Inc()
		}
		if stop, err := s.park(ctx, woken, end); err != nil {
			return err
		} else if stop {
			end = time.Now()
		}
	}
}

// tryLease leases what is deliverable now, without a Raft round trip when
// nothing is and the group exists (a first fetch creates its group). The
// answer comes from the lease's own result: the FSM copies each leased
// message out of the transaction that chose it, on the node that waits.
func (s *Server) tryLease(r *route, max int, leaseMs int64) ([]fetchedMessage, error) {
	now := nowMs()
	var ackTimeoutMs int64
	needed := false
	err := s.node.FSM.Read(func(rd *raftfsm.Reader) error {
		cfg, err := rd.TopicConfig(r.topic)
		if err != nil {
			return err
		}
		ackTimeoutMs = cfg.AckTimeoutMs
		needed, err = rd.NeedsLease(r.topic, r.group, now)
		return err
	})
	if err != nil || !needed {
		return []fetchedMessage{}, err
	}
	if leaseMs == 0 {
		leaseMs = ackTimeoutMs
	}
	// Group-committed: concurrent fetches (and publishes, acks) share one
	// raft entry and one FSM transaction.
	res, err := s.node.ApplyBatched(r.ctx, &raftfsm.Command{Op: raftfsm.OpLease, Now: now, Topic: r.topic, Group: r.group,
		Max: uint32(max), LeaseMs: leaseMs})
	if err != nil {
		return nil, err
	}
	ds, err := s.node.FSM.FillLeased(r.topic, res.Deliveries)
	if err != nil {
		return nil, err
	}
	out := make([]fetchedMessage, len(ds))
	for i, d := range ds {
		m := d.Msg
		out[i] = fetchedMessage{
			Topic: r.topic, Partition: d.Partition, Offset: d.Offset,
			Receipt:        group.Receipt{Partition: d.Partition, Offset: d.Offset, Delivery: d.Delivery}.Encode(r.topic, r.group),
			ValueB64:       base64.StdEncoding.EncodeToString(m.Value),
			IdempotencyKey: m.IdempotencyKey, RetryCount: d.RetryCount, MaxRetry: m.MaxRetry,
			PublishedAt: rfc3339ms(m.PublishedAt),
			Attrs:       attrsMap(m.Attrs), RejectReason: d.Reason,
		}
	}
	return out, nil
}

type receiptsBody struct {
	Receipts []string `json:"receipts"`
	LeaseMs  *int64   `json:"lease_ms"`
}

type receiptResult struct {
	Receipt string `json:"receipt"`
	Status  string `json:"status"`
}

func (s *Server) ack(ctx *fasthttp.RequestCtx, r *route) error {
	return s.receiptOp(ctx, r, raftfsm.OpAck)
}

func (s *Server) extend(ctx *fasthttp.RequestCtx, r *route) error {
	return s.receiptOp(ctx, r, raftfsm.OpExtend)
}

// receiptOp runs ack or extend.
func (s *Server) receiptOp(ctx *fasthttp.RequestCtx, r *route, op raftfsm.Op) error {
	var b receiptsBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	cmd := &raftfsm.Command{Op: op, Now: nowMs(), Topic: r.topic, Group: r.group}
	switch {
	case op == raftfsm.OpExtend && b.LeaseMs == nil:
		return fmt.Errorf("%w: lease_ms is required", ErrBadRequest)
	case op == raftfsm.OpExtend:
		if err := checkRange("lease_ms", *b.LeaseMs, 1, 12*3600*1000); err != nil {
			return err
		}
		cmd.LeaseMs = *b.LeaseMs
	case b.LeaseMs != nil:
		return fmt.Errorf("%w: unknown field \"lease_ms\" for ack", ErrBadRequest)
	}
	return s.runReceipts(ctx, r, cmd, b.Receipts)
}

// runReceipts runs ack, extend or nack: malformed receipts are answered
// "invalid" at once, the rest go to the FSM in one command.
func (s *Server) runReceipts(ctx *fasthttp.RequestCtx, r *route, cmd *raftfsm.Command, receipts []string) error {
	if len(receipts) == 0 || len(receipts) > maxReceipts {
		return fmt.Errorf("%w: receipts must hold 1..%d receipts", ErrBadRequest, maxReceipts)
	}
	out := make([]receiptResult, len(receipts))
	var idx []int
	for i, rs := range receipts {
		out[i] = receiptResult{Receipt: rs, Status: group.StatusInvalid}
		rc, err := group.ParseReceipt(rs, r.topic, r.group)
		if err != nil {
			continue
		}
		cmd.Receipts = append(cmd.Receipts, rc)
		idx = append(idx, i)
	}
	if cmd.Op == raftfsm.OpNack {
		cmd.Rands = make([]uint32, len(cmd.Receipts))
		for i := range cmd.Rands {
			cmd.Rands[i] = rand.Uint32()
		}
	}
	if len(cmd.Receipts) > 0 {
		res, err := s.node.ApplyBatched(r.ctx, cmd)
		if errors.Is(err, group.ErrGroupNotFound) {
			res, err = &raftfsm.Result{Statuses: slices.Repeat([]string{group.StatusInvalid}, len(idx))}, nil
		}
		if err != nil {
			return err
		}
		for j, i := range idx {
			out[i].Status = res.Statuses[j]
		}
		s.metrics.countReceipts(cmd.Op.String(), res.Statuses)
	}
	writeJSON(ctx, 200, map[string]any{"results": out})
	return nil
}

func sortAttrs(a []mlog.Attr) {
	slices.SortFunc(a, func(x, y mlog.Attr) int { return strings.Compare(x.Name, y.Name) })
}
