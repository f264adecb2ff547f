package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
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
			writeFetched(ctx, r.topic, r.group, msgs)
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
func (s *Server) tryLease(r *route, max int, leaseMs int64) ([]group.Delivery, error) {
	now := nowMs()
	var ackTimeoutMs int64
	needed := false
	err := s.state.Read(func(rd *fsm.Reader) error {
		cfg, err := rd.TopicConfig(r.topic)
		if err != nil {
			return err
		}
		ackTimeoutMs = cfg.AckTimeoutMs
		needed, err = rd.NeedsLease(r.topic, r.group, now)
		return err
	})
	if err != nil || !needed {
		return nil, err
	}
	if leaseMs == 0 {
		leaseMs = ackTimeoutMs
	}
	// Group-committed: concurrent fetches (and publishes, acks) share one
	// raft entry and one FSM transaction.
	res, err := s.node.ApplyBatched(r.ctx, &command.Command{Op: command.OpLease, Now: now, Topic: r.topic, Group: r.group,
		Max: uint32(max), LeaseMs: leaseMs})
	if err != nil {
		return nil, err
	}
	return s.state.FillLeased(r.topic, res.Deliveries)
}

var fetchBufs = sync.Pool{New: func() any { return new([]byte) }}

// writeFetched answers a fetch: the bytes writeJSON writes for
// {"messages": [fetchedJSON of each]}, appended by hand (no reflection, no
// map per message, values base64-encoded straight into the answer).
// TestAppendFetchedMatchesJSON holds the two to the same bytes.
func writeFetched(ctx *fasthttp.RequestCtx, topic, grp string, ds []group.Delivery) {
	bp := fetchBufs.Get().(*[]byte)
	b := appendFetched((*bp)[:0], topic, grp, ds)
	b = append(b, '\n')
	ctx.SetStatusCode(200)
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("Content-Length", strconv.Itoa(len(b)))
	ctx.SetBody(b) // copies
	if cap(b) <= 4<<20 {
		*bp = b
		fetchBufs.Put(bp)
	}
}

func appendFetched(b []byte, topic, grp string, ds []group.Delivery) []byte {
	b = append(b, `{"messages":[`...)
	for i, d := range ds {
		if i > 0 {
			b = append(b, ',')
		}
		m := d.Msg
		b = append(b, `{"topic":`...)
		b = appendJSONString(b, topic)
		b = append(b, `,"partition":`...)
		b = strconv.AppendUint(b, uint64(d.Partition), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendUint(b, d.Offset, 10)
		b = append(b, `,"receipt":`...)
		b = appendJSONString(b, group.Receipt{Partition: d.Partition, Offset: d.Offset, Delivery: d.Delivery}.Encode(topic, grp))
		b = append(b, `,"value_b64":"`...)
		b = base64.StdEncoding.AppendEncode(b, m.Value) // nothing in it to escape
		b = append(b, `","idempotency_key":`...)
		b = appendJSONString(b, m.IdempotencyKey)
		b = append(b, `,"retry_count":`...)
		b = strconv.AppendUint(b, uint64(d.RetryCount), 10)
		b = append(b, `,"max_retry":`...)
		b = strconv.AppendInt(b, m.MaxRetry, 10)
		b = append(b, `,"reject_reason":`...)
		b = appendJSONString(b, d.Reason)
		b = append(b, `,"published_at":`...)
		b = appendJSONString(b, rfc3339ms(m.PublishedAt))
		b = append(b, `,"attrs":{`...)
		b = appendAttrs(b, m.Attrs)
		b = append(b, "}}"...)
	}
	return append(b, "]}"...)
}

// appendAttrs appends attributes as encoding/json writes attrsMap's map:
// names sorted, a repeated name once with its last value.
func appendAttrs(b []byte, as []mlog.Attr) []byte {
	if len(as) == 0 {
		return b
	}
	sorted := slices.Clone(as)
	slices.SortStableFunc(sorted, func(x, y mlog.Attr) int { return strings.Compare(x.Name, y.Name) })
	first := true
	for i, a := range sorted {
		if i+1 < len(sorted) && sorted[i+1].Name == a.Name {
			continue // the map keeps the last
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, a.Name)
		b = append(b, ':')
		b = appendJSONString(b, a.Value)
	}
	return b
}

// appendJSONString appends s as encoding/json would: quoted as is when it
// is printable ASCII with nothing to escape, else through json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
	return s.receiptOp(ctx, r, command.OpAck)
}

func (s *Server) extend(ctx *fasthttp.RequestCtx, r *route) error {
	return s.receiptOp(ctx, r, command.OpExtend)
}

// receiptOp runs ack or extend.
func (s *Server) receiptOp(ctx *fasthttp.RequestCtx, r *route, op command.Op) error {
	var b receiptsBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	cmd := &command.Command{Op: op, Now: nowMs(), Topic: r.topic, Group: r.group}
	switch {
	case op == command.OpExtend && b.LeaseMs == nil:
		return fmt.Errorf("%w: lease_ms is required", ErrBadRequest)
	case op == command.OpExtend:
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
func (s *Server) runReceipts(ctx *fasthttp.RequestCtx, r *route, cmd *command.Command, receipts []string) error {
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
	if cmd.Op == command.OpNack {
		cmd.Rands = make([]uint32, len(cmd.Receipts))
		for i := range cmd.Rands {
			cmd.Rands[i] = rand.Uint32()
		}
	}
	if len(cmd.Receipts) == 0 {
		// Nothing to propose, but an unknown topic is still a 404, as it
		// is when a receipt parses (the FSM refuses the command).
		if _, err := s.topicConfig(r.topic); err != nil {
			return err
		}
	}
	if len(cmd.Receipts) > 0 {
		res, err := s.node.ApplyBatched(r.ctx, cmd)
		if errors.Is(err, group.ErrGroupNotFound) {
			res, err = &fsm.Result{Statuses: slices.Repeat([]string{group.StatusInvalid}, len(idx))}, nil
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
