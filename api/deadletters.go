package api

import (
	"encoding/base64"
	"fmt"
	"slices"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

const (
	maxReasonLen      = 1024
	defaultReplayRate = 100
	maxReplayRate     = 100000
	maxDLQPage        = 1000
)

type nackBody struct {
	Receipts  []string `json:"receipts"`
	Reason    *string  `json:"reason"`
	Retryable *bool    `json:"retryable"`
	DelayMs   *int64   `json:"delay_ms"`
}

func (s *Server) nack(ctx *fasthttp.RequestCtx, r *route) error {
	var b nackBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	cmd := &command.Command{Op: command.OpNack, Now: nowMs(), Topic: r.topic, Group: r.group,
		NodeID: s.node.ID(), Retryable: true, DelayMs: -1}
	if b.Retryable != nil {
		cmd.Retryable = *b.Retryable
	}
	if b.Reason != nil {
		if len(*b.Reason) > maxReasonLen {
			return fmt.Errorf("%w: reason over %d bytes", ErrBadRequest, maxReasonLen)
		}
		cmd.Reason = *b.Reason
	}
	if b.DelayMs != nil {
		if err := checkRange("delay_ms", *b.DelayMs, 0, maxDelayMs); err != nil {
			return err
		}
		cmd.DelayMs = *b.DelayMs
	}
	return s.runReceipts(ctx, r, cmd, b.Receipts)
}

type deadLetterJSON struct {
	ID             uint64            `json:"id"`
	Partition      uint32            `json:"partition"`
	Offset         uint64            `json:"offset"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	Attrs          map[string]string `json:"attrs"`
	PublishedAt    string            `json:"published_at"`
	RejectReason   string            `json:"reject_reason"`
	RetryCount     uint32            `json:"retry_count"`
	DeadAt         string            `json:"dead_at"`
	History        []historyJSON     `json:"history"`
}

type historyJSON struct {
	At     string `json:"at"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Node   string `json:"node"`
}

func rfc3339ms(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func letterJSON(l *dlq.Letter) deadLetterJSON {
	out := deadLetterJSON{ID: l.ID, Partition: l.Partition, Offset: l.Offset,
		ValueB64: base64.StdEncoding.EncodeToString(l.Msg.Value), IdempotencyKey: l.Msg.IdempotencyKey,
		Attrs: attrsMap(l.Msg.Attrs), PublishedAt: rfc3339ms(l.Msg.PublishedAt), RejectReason: l.RejectReason,
		RetryCount: l.RetryCount, DeadAt: rfc3339ms(l.DeadAt), History: make([]historyJSON, len(l.History))}
	for i, h := range l.History {
		out.History[i] = historyJSON{At: rfc3339ms(h.At), Kind: h.Kind, Reason: h.Reason, Node: h.Node}
	}
	return out
}

func attrsMap(as []mlog.Attr) map[string]string {
	m := make(map[string]string, len(as))
	for _, a := range as {
		m[a.Name] = a.Value
	}
	return m
}

// queryUint reads a non-negative integer query argument.
func queryUint(ctx *fasthttp.RequestCtx, name string, def, lo, hi uint64) (uint64, error) {
	v := ctx.QueryArgs().Peek(name)
	if len(v) == 0 {
		return def, nil
	}
	n, ok := parseDigits(v)
	if !ok || n < lo || n > hi {
		return 0, fmt.Errorf("%w: query %s must be an integer in [%d, %d]", ErrBadRequest, name, lo, hi)
	}
	return n, nil
}

func (s *Server) listDeadLetters(ctx *fasthttp.RequestCtx, r *route) error {
	limit, err := queryUint(ctx, "limit", 100, 1, maxDLQPage)
	if err != nil {
		return err
	}
	after, err := queryUint(ctx, "after", 0, 0, 1<<62)
	if err != nil {
		return err
	}
	key := string(ctx.QueryArgs().Peek("idempotency_key"))
	if len(key) > maxKeyLen {
		return fmt.Errorf("%w: idempotency_key over %d bytes", ErrBadRequest, maxKeyLen)
	}
	var letters []*dlq.Letter
	err = s.state.Read(func(rd *fsm.Reader) error {
		var err error
		// One more than the page: next_after only when there is a next.
		letters, err = rd.DeadLetters(r.topic, r.group, after, int(limit)+1, key)
		return err
	})
	if err != nil {
		return err
	}
	more := len(letters) > int(limit)
	if more {
		letters = letters[:limit]
	}
	out := make([]deadLetterJSON, 0, len(letters))
	for _, lt := range letters {
		out = append(out, letterJSON(lt))
	}
	var next any
	if more {
		next = out[len(out)-1].ID
	}
	writeJSON(ctx, 200, map[string]any{"dead_letters": out, "next_after": next})
	return nil
}

type replayBody struct {
	IDs        []uint64 `json:"ids"`
	All        *bool    `json:"all"`
	RatePerSec *int64   `json:"rate_per_sec"`
}

func (s *Server) replayDeadLetters(ctx *fasthttp.RequestCtx, r *route) error {
	var b replayBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	all := b.All != nil && *b.All
	if all == (len(b.IDs) > 0) {
		return fmt.Errorf(`%w: give either "ids" (1..%d) or "all":true`, ErrBadRequest, maxDLQPage)
	}
	if len(b.IDs) > maxDLQPage {
		return fmt.Errorf("%w: at most %d ids", ErrBadRequest, maxDLQPage)
	}
	if slices.Contains(b.IDs, 0) {
		return fmt.Errorf("%w: dead-letter ids are positive integers, got 0", ErrBadRequest)
	}
	rate := int64(defaultReplayRate)
	if b.RatePerSec != nil {
		if err := checkRange("rate_per_sec", *b.RatePerSec, 1, maxReplayRate); err != nil {
			return err
		}
		rate = *b.RatePerSec
	}
	if all {
		// Nothing to replay writes nothing: no raft entry for an empty
		// store (a 404 for a missing topic or group all the same).
		empty, err := s.noDeadLetters(r)
		if err != nil || empty {
			if err == nil {
				writeJSON(ctx, 200, map[string]any{"accepted": 0, "rate_per_sec": rate})
			}
			return err
		}
	}
	if err := s.node.CheckDisk(0); err != nil {
		return err
	}
	res, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpReplay, Now: nowMs(), Topic: r.topic, Group: r.group,
		IDs: b.IDs, All: all, Rate: uint64(rate)})
	if err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"accepted": res.Accepted, "rate_per_sec": rate})
	return nil
}

// noDeadLetters reports whether the route's group holds no dead letter
// (errors: the topic or group does not exist).
func (s *Server) noDeadLetters(r *route) (bool, error) {
	var n int
	err := s.state.Read(func(rd *fsm.Reader) error {
		letters, err := rd.DeadLetters(r.topic, r.group, 0, 1, "")
		n = len(letters)
		return err
	})
	return n == 0, err
}

func (s *Server) deleteDeadLetter(ctx *fasthttp.RequestCtx, r *route) error {
	id, ok := parseDigits([]byte(r.dlqID))
	if !ok || id == 0 {
		return fmt.Errorf("%w: dead-letter id must be a positive integer", ErrBadRequest)
	}
	if _, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpDeleteDeadLetter, Now: nowMs(), Topic: r.topic,
		Group: r.group, IDs: []uint64{id}}); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"deleted": id})
	return nil
}
