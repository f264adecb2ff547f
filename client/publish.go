package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// PublishOptions are a publish's optional headers.
type PublishOptions struct {
	// IdempotencyKey dedups the publish within the topic's window; with it,
	// the client retries a publish that got no answer or a 503 (with the
	// same key), since the broker stores it at most once.
	IdempotencyKey string
	// PartitionKey picks the partition (same key, same partition).
	PartitionKey string
	// ProducerID and ProducerSeq: a Kafka-style producer sequence (both or
	// neither; HasSeq marks ProducerSeq as set). Also makes retries safe.
	ProducerID  string
	ProducerSeq uint64
	HasSeq      bool
	// Delay: not delivered before now + Delay (millisecond resolution).
	Delay time.Duration
	// MaxRetry overrides the topic's max_retry for this message when >= 0
	// (use -1, or leave nil, for the topic's).
	MaxRetry *int
	// Attrs are application attributes (Mq-Attr-{name}), returned on delivery.
	Attrs map[string]string
}

// PublishResult is where a message was stored.
type PublishResult struct {
	Topic     string `json:"topic"`
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Duplicate bool   `json:"duplicate"`
	// Raw is the broker's answer.
	Raw json.RawMessage `json:"-"`
}

// Publish stores value in topic. Without an idempotency key or producer
// sequence, a publish that may have reached a node is not retried (it could
// be stored twice); its error then satisfies IsRetryable and the caller
// decides.
func (c *Client) Publish(ctx context.Context, topic string, value []byte, o PublishOptions) (*PublishResult, error) {
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	p := retryUnsent
	if o.IdempotencyKey != "" {
		h.Set("Idempotency-Key", o.IdempotencyKey)
		p = retrySafe
	}
	if o.ProducerID != "" && o.HasSeq {
		h.Set("Mq-Producer-Id", o.ProducerID)
		h.Set("Mq-Producer-Seq", strconv.FormatUint(o.ProducerSeq, 10))
		p = retrySafe
	}
	if p == retryUnsent && broken(breakRetryUnkeyed) {
		p = retrySafe
	}
	if o.PartitionKey != "" {
		h.Set("Mq-Partition-Key", o.PartitionKey)
	}
	if o.Delay > 0 {
		h.Set("Mq-Delay-Ms", strconv.FormatInt(o.Delay.Milliseconds(), 10))
	}
	if o.MaxRetry != nil && *o.MaxRetry >= 0 {
		h.Set("Mq-Max-Retry", strconv.Itoa(*o.MaxRetry))
	}
	for k, v := range o.Attrs {
		h.Set("Mq-Attr-"+k, v)
	}
	if value == nil {
		value = []byte{}
	}
	resp, err := c.do(ctx, &request{method: http.MethodPost, path: "/v1/topics/" + esc(topic) + "/messages",
		body: value, header: h, policy: p})
	if err != nil {
		return nil, err
	}
	var r PublishResult
	if err := json.Unmarshal(resp.Body, &r); err != nil {
		return nil, err
	}
	r.Raw = resp.Body
	return &r, nil
}

// BatchMessage is one message of PublishBatch. Value is sent as value_b64.
type BatchMessage struct {
	Value          []byte
	IdempotencyKey string
	PartitionKey   string
	Delay          time.Duration
	MaxRetry       *int // nil or < 0: the topic's
	Attrs          map[string]string
}

// PublishBatch stores msgs in topic as one all-or-nothing write and returns
// their places in request order. It is retried like Publish: after a lost
// answer or a 503 only when every message has an idempotency key (each is
// deduplicated on its own), otherwise only when it was never sent.
func (c *Client) PublishBatch(ctx context.Context, topic string, msgs []BatchMessage) ([]PublishResult, error) {
	p := retrySafe
	items := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		it := map[string]any{"value_b64": base64.StdEncoding.EncodeToString(m.Value)}
		if m.IdempotencyKey != "" {
			it["idempotency_key"] = m.IdempotencyKey
		} else {
			p = retryUnsent
		}
		if m.PartitionKey != "" {
			it["partition_key"] = m.PartitionKey
		}
		if m.Delay > 0 {
			it["delay_ms"] = m.Delay.Milliseconds()
		}
		if m.MaxRetry != nil && *m.MaxRetry >= 0 {
			it["max_retry"] = *m.MaxRetry
		}
		if len(m.Attrs) > 0 {
			it["attrs"] = m.Attrs
		}
		items[i] = it
	}
	var out struct {
		Results []PublishResult `json:"results"`
	}
	if _, err := c.call(ctx, http.MethodPost, "/v1/topics/"+esc(topic)+"/messages:batch",
		map[string]any{"messages": items}, &out, p, 0); err != nil {
		return nil, err
	}
	return out.Results, nil
}
