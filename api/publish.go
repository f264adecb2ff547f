package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

const (
	maxKeyLen    = 256
	maxAttrs     = 64
	maxAttrName  = 128
	maxAttrVal   = 4096
	maxDelayMs   = 90 * 24 * 3600 * 1000 // 90 days
	maxRetries   = 1000
	maxBackoffMs = 24 * 3600 * 1000 // a day
)

// publishAnswer is the JSON of one published message; appendPublishAnswer
// writes it.
type publishAnswer struct {
	Topic     string `json:"topic"`
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Duplicate bool   `json:"duplicate"`
}

// producer is a request's Mq-Producer-Id and Mq-Producer-Seq.
type producer struct {
	id  string
	seq uint64
}

func producerFromHeaders(h *fasthttp.RequestHeader) (producer, error) {
	id, hasID, err := oneHeader(h, "Mq-Producer-Id")
	if err != nil {
		return producer{}, err
	}
	seq, hasSeq, err := oneHeader(h, "Mq-Producer-Seq")
	if err != nil {
		return producer{}, err
	}
	if !hasID && !hasSeq {
		return producer{}, nil
	}
	if !hasID || !hasSeq {
		return producer{}, fmt.Errorf("%w: Mq-Producer-Id and Mq-Producer-Seq go together", ErrBadHeader)
	}
	pid, err := checkKey("Mq-Producer-Id", string(id))
	if err != nil {
		return producer{}, err
	}
	n, ok := parseDigits(seq)
	if !ok || n > math.MaxInt64 {
		return producer{}, fmt.Errorf("%w: Mq-Producer-Seq must be a non-negative integer (digits only, at most %d)", ErrBadHeader, int64(math.MaxInt64))
	}
	return producer{id: pid, seq: n}, nil
}

// pubMsg is one message to publish before placement.
type pubMsg struct {
	msg          *mlog.Message
	partitionKey string
}

// onePublish is a single publish's command, placement and message in one
// allocation: the command holds on to the other two until it is applied.
type onePublish struct {
	cmd    command.Command
	placed [1]mlog.Placed
	msg    mlog.Message
}

func (s *Server) publish(ctx *fasthttp.RequestCtx, r *route) error {
	one := &onePublish{}
	m, err := messageFromHeaders(&ctx.Request.Header, &one.msg)
	if err != nil {
		return err
	}
	prod, err := producerFromHeaders(&ctx.Request.Header)
	if err != nil {
		return err
	}
	// The value aliases fasthttp's body buffer, reused after this handler
	// returns: ApplyBatched encodes (copies) it before it waits.
	m.msg.Value = ctx.PostBody()
	// A repeated idempotency key is answered by the FSM, the one place that
	// decides duplicates: the leader does not look it up before proposing
	// (docs/performance.md, "Idempotency key overhead", has why).
	one.cmd.Msgs = one.placed[:]
	res, err := s.publishCmd(ctx, r, &one.cmd, []pubMsg{m}, prod)
	if err != nil {
		return err
	}
	p := res.Published[0]
	status := 201
	if p.Duplicate {
		status = 200
	}
	writePublished(ctx, status, r.topic, p)
	return nil
}

// publishMsgs places the messages on partitions and commits them as one
// command.
func (s *Server) publishMsgs(ctx *fasthttp.RequestCtx, r *route, msgs []pubMsg, prod producer) (*fsm.Result, error) {
	return s.publishCmd(ctx, r, &command.Command{Msgs: make([]mlog.Placed, len(msgs))}, msgs, prod)
}

// publishCmd is publishMsgs on a command whose Msgs has a place for each
// message.
func (s *Server) publishCmd(ctx *fasthttp.RequestCtx, r *route, cmd *command.Command, msgs []pubMsg, prod producer) (*fsm.Result, error) {
	cfg, err := s.topicConfig(r.topic)
	if err != nil {
		if r.remote {
			// This follower may not know the topic yet: the leader decides.
			return nil, errCoalesceFallback
		}
		return nil, err
	}
	cmd.Op, cmd.Now, cmd.Topic, cmd.Producer, cmd.Seq = command.OpPublish, nowMs(), r.topic, prod.id, prod.seq
	bodySize := 0
	for i, m := range msgs {
		// A message over the topic's max_message_bytes is refused here,
		// unless it repeats a stored one (by key or producer sequence; the
		// max may have been lowered since): that one goes to the FSM,
		// which answers it as a duplicate. Only such messages cost a read.
		if err := cfg.CheckSize(len(m.msg.Value)); err != nil {
			if r.remote {
				return nil, errCoalesceFallback // the leader's state decides
			}
			if !s.repeatsStored(r.topic, cfg, m, prod, i) {
				return nil, err
			}
		}
		bodySize += len(m.msg.Value)
		cmd.Msgs[i] = mlog.Placed{Partition: s.choosePartition(cfg.Partitions, m), Msg: m.msg}
	}
	var res *fsm.Result
	if r.remote {
		res, err = s.coal.call(r.ctx, s, ctx, r, cmd) // the leader checks and proposes it
	} else {
		res, err = s.proposePublish(r.ctx, cmd, bodySize)
	}
	if errors.Is(err, fsm.ErrSeqGap) || errors.Is(err, fsm.ErrSeqTooOld) || errors.Is(err, fsm.ErrSeqOverlap) {
		ctx.Response.Header.Set("Mq-Expected-Seq", strconv.FormatUint(res.Expected, 10))
	}
	return res, err
}

// proposePublish is the leader's part of a publish, whichever node parsed
// it: the disk floor, the proposal through group commit, its metrics.
func (s *Server) proposePublish(ctx context.Context, cmd *command.Command, bodySize int) (*fsm.Result, error) {
	if err := s.node.CheckDisk(bodySize); err != nil {
		return nil, err
	}
	start := time.Now()
	res, err := s.node.ApplyBatched(ctx, cmd)
	s.metrics.commit(time.Since(start), err)
	if err == nil {
		s.metrics.countPublished(cmd.Topic, res.Published)
	}
	return res, err
}

// repeatsStored reports whether message i of a publish repeats a stored
// message (by its key within the dedup window, or by its producer
// sequence), as the leader's state has it now.
func (s *Server) repeatsStored(topic string, cfg mlog.Config, m pubMsg, prod producer, i int) bool {
	key := m.msg.IdempotencyKey
	if cfg.DedupWindowMs <= 0 {
		key = ""
	}
	if key == "" && prod.id == "" {
		return false
	}
	var ok bool
	_ = s.state.Read(func(r *fsm.Reader) error {
		var err error
		ok, err = r.Stored(topic, key, prod.id, prod.seq+uint64(i), nowMs())
		return err
	})
	return ok
}

// choosePartition: FNV-1a 32 of the partition key, else of the idempotency
// key, else round robin.
func (s *Server) choosePartition(n uint32, m pubMsg) uint32 {
	key := m.partitionKey
	if key == "" {
		key = m.msg.IdempotencyKey
	}
	if key == "" {
		return (s.rr.Add(1) - 1) % n
	}
	return PartitionFor(key, n)
}

// PartitionFor is the partition of a key among n: FNV-1a 32-bit mod n.
func PartitionFor(key string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32() % n
}

// messageFromHeaders reads a single publish's headers into msg.
func messageFromHeaders(h *fasthttp.RequestHeader, msg *mlog.Message) (pubMsg, error) {
	*msg = mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1}
	m := pubMsg{msg: msg}
	var err error
	if msg.IdempotencyKey, err = keyHeader(h, "Idempotency-Key"); err != nil {
		return m, err
	}
	if m.partitionKey, err = keyHeader(h, "Mq-Partition-Key"); err != nil {
		return m, err
	}
	nums := [...]struct {
		name string
		dst  *int64
		max  int64
	}{
		{"Mq-Delay-Ms", &msg.DeliverAt, maxDelayMs},
		{"Mq-Max-Retry", &msg.MaxRetry, maxRetries},
		{"Mq-Backoff-Base-Ms", &msg.BackoffBaseMs, maxBackoffMs},
		{"Mq-Backoff-Jitter-Ms", &msg.BackoffJitterMs, maxBackoffMs},
	}
	for _, n := range nums {
		v, ok, err := oneHeader(h, n.name)
		if err != nil {
			return m, err
		}
		if !ok {
			continue
		}
		x, ok := parseDigits(v)
		if !ok || x > uint64(n.max) {
			return m, fmt.Errorf("%w: %s must be an integer in [0, %d], digits only", ErrBadHeader, n.name, n.max)
		}
		*n.dst = int64(x)
	}
	if msg.DeliverAt > 0 {
		msg.DeliverAt += nowMs()
	}
	var attrErr error
	h.VisitAll(func(k, v []byte) {
		if !hasPrefixFold(k, attrPrefix) || attrErr != nil {
			return
		}
		name := string(k[len(attrPrefix):])
		if len(msg.Attrs) >= maxAttrs {
			attrErr = fmt.Errorf("%w: more than %d Mq-Attr-* headers", ErrBadHeader, maxAttrs)
			return
		}
		if name == "" || len(name) > maxAttrName || len(v) > maxAttrVal || !utf8.Valid(v) {
			attrErr = fmt.Errorf("%w: an Mq-Attr-* header: name 1..%d bytes, value at most %d bytes of UTF-8", ErrBadHeader, maxAttrName, maxAttrVal)
			return
		}
		name = strings.ToLower(name)
		for _, a := range msg.Attrs {
			if a.Name == name {
				attrErr = fmt.Errorf("%w: attribute %q given twice", ErrBadHeader, name)
				return
			}
		}
		msg.Attrs = append(msg.Attrs, mlog.Attr{Name: name, Value: string(v)})
	})
	return m, attrErr
}

// keyHeader reads a key header given at most once: "" when absent.
func keyHeader(h *fasthttp.RequestHeader, name string) (string, error) {
	v, ok, err := oneHeader(h, name)
	if err != nil || !ok {
		return "", err
	}
	return checkKey(name, string(v))
}

// attrPrefix begins the header of each of a message's attributes.
const attrPrefix = "Mq-Attr-"

// hasPrefixFold reports whether k begins with the ASCII prefix, in any
// case, without making a string of each header name it is asked about.
func hasPrefixFold(k []byte, prefix string) bool {
	if len(k) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		if lowerASCII(k[i]) != lowerASCII(prefix[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// batchBody is the JSON of POST .../messages:batch.
// singleHeaders are the headers of a single publish that describe its
// message; a batch gives each message these in its body instead.
var singleHeaders = []string{"Idempotency-Key", "Mq-Partition-Key", "Mq-Delay-Ms", "Mq-Max-Retry", "Mq-Backoff-Base-Ms", "Mq-Backoff-Jitter-Ms"}

// noSingleHeaders refuses a batch that carries a single publish's message
// headers: ignored, an Idempotency-Key would let a retried batch store
// every message twice.
func noSingleHeaders(h *fasthttp.RequestHeader) error {
	name := ""
	for _, n := range singleHeaders {
		if len(h.PeekAll(n)) > 0 {
			name = n
			break
		}
	}
	if name == "" {
		h.VisitAll(func(k, _ []byte) {
			if hasPrefixFold(k, attrPrefix) && name == "" {
				name = "Mq-Attr-*"
			}
		})
	}
	if name == "" {
		return nil
	}
	return fmt.Errorf("%w: %s is for a single publish; in a batch each message sets idempotency_key, partition_key, delay_ms, max_retry and attrs in the body", ErrBadHeader, name)
}

type batchBody struct {
	Messages []batchMsg `json:"messages"`
}

type batchMsg struct {
	ValueB64       *string           `json:"value_b64"`
	Value          *string           `json:"value"`
	IdempotencyKey *string           `json:"idempotency_key"`
	PartitionKey   *string           `json:"partition_key"`
	DelayMs        *int64            `json:"delay_ms"`
	MaxRetry       *int64            `json:"max_retry"`
	Attrs          map[string]string `json:"attrs"`
}

func (b *batchMsg) toMsg(i int) (pubMsg, error) {
	m := pubMsg{msg: &mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1}}
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: messages[%d]: %s", ErrBadRequest, i, fmt.Sprintf(f, a...))
	}
	switch {
	case b.ValueB64 != nil && b.Value != nil:
		return m, bad("give value_b64 or value, not both")
	case b.ValueB64 != nil:
		v, err := base64.StdEncoding.DecodeString(*b.ValueB64)
		if err != nil {
			return m, bad("value_b64 is not valid base64")
		}
		m.msg.Value = v
	case b.Value != nil:
		m.msg.Value = []byte(*b.Value)
	default:
		return m, bad("value_b64 or value is required")
	}
	var err error
	if b.IdempotencyKey != nil {
		if m.msg.IdempotencyKey, err = checkKey("idempotency_key", *b.IdempotencyKey); err != nil {
			return m, bad("%v", err)
		}
	}
	if b.PartitionKey != nil {
		if m.partitionKey, err = checkKey("partition_key", *b.PartitionKey); err != nil {
			return m, bad("%v", err)
		}
	}
	if b.DelayMs != nil {
		if *b.DelayMs < 0 || *b.DelayMs > maxDelayMs {
			return m, bad("delay_ms must be in [0, %d]", maxDelayMs)
		}
		if *b.DelayMs > 0 {
			m.msg.DeliverAt = nowMs() + *b.DelayMs
		}
	}
	if b.MaxRetry != nil {
		if *b.MaxRetry < 0 || *b.MaxRetry > maxRetries {
			return m, bad("max_retry must be in [0, 1000]")
		}
		m.msg.MaxRetry = *b.MaxRetry
	}
	if len(b.Attrs) > maxAttrs {
		return m, bad("more than %d attrs", maxAttrs)
	}
	for k, v := range b.Attrs {
		if k == "" || len(k) > maxAttrName || len(v) > maxAttrVal {
			return m, bad("attr %q: name 1..%d bytes, value at most %d bytes", k, maxAttrName, maxAttrVal)
		}
		m.msg.Attrs = append(m.msg.Attrs, mlog.Attr{Name: k, Value: v})
	}
	sortAttrs(m.msg.Attrs)
	return m, nil
}

func (s *Server) publishBatch(ctx *fasthttp.RequestCtx, r *route) error {
	if err := noSingleHeaders(&ctx.Request.Header); err != nil {
		return err
	}
	var b batchBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	if len(b.Messages) == 0 {
		return fmt.Errorf("%w: messages must hold 1..%d messages", ErrBadRequest, MaxBatchMessages)
	}
	if len(b.Messages) > MaxBatchMessages {
		return fmt.Errorf("%w: %d messages > %d", ErrBodyTooLarge, len(b.Messages), MaxBatchMessages)
	}
	msgs := make([]pubMsg, len(b.Messages))
	total := 0
	for i := range b.Messages {
		m, err := b.Messages[i].toMsg(i)
		if err != nil {
			return err
		}
		total += len(m.msg.Value)
		msgs[i] = m
	}
	if total > MaxBatchBytes {
		return fmt.Errorf("%w: batch payloads total %d bytes > %d", ErrBodyTooLarge, total, MaxBatchBytes)
	}
	prod, err := producerFromHeaders(&ctx.Request.Header)
	if err != nil {
		return err
	}
	res, err := s.publishMsgs(ctx, r, msgs, prod)
	if err != nil {
		return err
	}
	writeBatchPublished(ctx, r.topic, res.Published)
	return nil
}
