package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Output is one message a process call publishes, to any topic.
type Output struct {
	Topic          string
	Value          []byte
	IdempotencyKey string // dedups the output in its topic's window
	PartitionKey   string
	DelayMs        int64
	MaxRetry       *int
	Attrs          map[string]string
}

// ProcessResult is the answer of Process: the receipts acked and where
// each output went, in order; Duplicate when it is the kept answer of an
// earlier call with the same receipts (a retry after a lost answer).
type ProcessResult struct {
	Acked     int             `json:"acked"`
	Duplicate bool            `json:"duplicate"`
	Results   []PublishResult `json:"results"`
}

// Process acks receipts of topic's group and publishes outputs as one
// atomic step (SPEC §10): all or nothing, and a repeat answers the first
// call's outcome, so it is retried after a lost answer like an ack. A
// stale or invalid receipt refuses the whole call: the error has code
// stale_receipt and nothing was published.
func (c *Client) Process(ctx context.Context, topic, group string, receipts []string, outputs []Output) (*ProcessResult, error) {
	pub := make([]map[string]any, len(outputs))
	for i, o := range outputs {
		m := map[string]any{"topic": o.Topic, "value_b64": base64.StdEncoding.EncodeToString(o.Value)}
		if o.IdempotencyKey != "" {
			m["idempotency_key"] = o.IdempotencyKey
		}
		if o.PartitionKey != "" {
			m["partition_key"] = o.PartitionKey
		}
		if o.DelayMs > 0 {
			m["delay_ms"] = o.DelayMs
		}
		if o.MaxRetry != nil && *o.MaxRetry >= 0 {
			m["max_retry"] = *o.MaxRetry
		}
		if len(o.Attrs) > 0 {
			m["attrs"] = o.Attrs
		}
		pub[i] = m
	}
	var out ProcessResult
	if _, err := c.call(ctx, http.MethodPost, groupPath(topic, group)+"/process",
		map[string]any{"ack": receipts, "publish": pub}, &out, retrySafe, 0); err != nil {
		return nil, err
	}
	return &out, nil
}

// ProcessHandler handles one message and answers the messages derived
// from it: ConsumeProcess publishes them and acks the message in one
// process call. An error nacks the message, as with a Handler.
type ProcessHandler func(ctx context.Context, m *Message) ([]Output, error)

// errSettled: the handler settled its message itself (handle does not ack
// or nack it).
var errSettled = errors.New("settled by the handler")

// ConsumeProcess is Consume with a handler whose outputs are published
// with the message's ack in one process call, while the lease is still
// kept alive: every message yields its outputs exactly once, whatever
// crashes or retries happen (the outputs' own idempotency keys are not
// needed for that). A call refused as stale (the lease was lost and
// another consumer may have processed the message) publishes nothing and
// is reported through o.OnError.
func (c *Client) ConsumeProcess(ctx context.Context, topic, group string, h ProcessHandler, o ConsumeOptions) error {
	return c.Consume(ctx, topic, group, func(hctx context.Context, m *Message) error {
		outs, err := h(hctx, m)
		if err != nil {
			return err
		}
		// Settle even when ctx has ended: the handler's work is done.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(hctx), c.timeout)
		defer cancel()
		if broken(breakPublishThenAck) { // the gap process closes: publish, then the loop acks
			return c.publishOutputs(sctx, outs)
		}
		if _, err := c.Process(sctx, topic, group, []string{m.Receipt}, outs); err != nil {
			if IsCode(err, "stale_receipt") || IsRetryable(err) {
				if o.OnError != nil {
					o.OnError(fmt.Errorf("process %s/%d@%d: %w", m.Topic, m.Partition, m.Offset, err))
				}
				return errSettled // the lease ends by itself; another delivery decides
			}
			return err // refused as a whole (unknown output topic, too large, ...): nack
		}
		return errSettled
	}, o)
}

// publishOutputs publishes outs one by one: what a consumer without
// process does (the conformance suite's publish_then_ack self-test only).
func (c *Client) publishOutputs(ctx context.Context, outs []Output) error {
	for _, o := range outs {
		if _, err := c.Publish(ctx, o.Topic, o.Value, PublishOptions{IdempotencyKey: o.IdempotencyKey,
			PartitionKey: o.PartitionKey, MaxRetry: o.MaxRetry, Attrs: o.Attrs, Delay: time.Duration(o.DelayMs) * time.Millisecond}); err != nil {
			return err
		}
	}
	return nil
}
