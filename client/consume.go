package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Message is one fetched (leased) message.
type Message struct {
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
	// Value is ValueB64 decoded.
	Value []byte `json:"-"`
	// Raw is this message's JSON object as the broker sent it.
	Raw json.RawMessage `json:"-"`
}

func (m *Message) UnmarshalJSON(b []byte) error {
	type plain Message
	if err := json.Unmarshal(b, (*plain)(m)); err != nil {
		return err
	}
	v, err := base64.StdEncoding.DecodeString(m.ValueB64)
	if err != nil {
		return fmt.Errorf("value_b64: %w", err)
	}
	m.Value, m.Raw = v, append(json.RawMessage(nil), b...)
	return nil
}

// FetchOptions: Max messages (default 10), Wait for the first one (long
// poll, default 0), Lease length (default the topic's ack_timeout_ms).
type FetchOptions struct {
	Max   int
	Wait  time.Duration
	Lease time.Duration
}

// Fetch leases up to o.Max messages of topic to group, waiting up to o.Wait
// for the first. The per-attempt timeout is Config.Timeout plus o.Wait. A
// fetch whose answer was lost is retried: the messages it may have leased
// come back after their lease runs out.
func (c *Client) Fetch(ctx context.Context, topic, group string, o FetchOptions) ([]Message, error) {
	body := map[string]int64{}
	if o.Max > 0 {
		body["max"] = int64(o.Max)
	}
	if o.Wait > 0 {
		body["wait_ms"] = o.Wait.Milliseconds()
	}
	if o.Lease > 0 {
		body["lease_ms"] = max(1, o.Lease.Milliseconds())
	}
	var out struct {
		Messages []Message `json:"messages"`
	}
	if _, err := c.call(ctx, http.MethodPost, groupPath(topic, group)+"/fetch", body, &out, retrySafe, o.Wait); err != nil {
		return nil, err
	}
	return out.Messages, nil
}

// Receipt statuses in ack, nack and extend answers.
const (
	StatusOK      = "ok"
	StatusStale   = "stale"   // the lease had already ended (or this receipt was acked before)
	StatusInvalid = "invalid" // not a receipt the broker issued for this topic and group
)

// ReceiptResult is the broker's answer for one receipt.
type ReceiptResult struct {
	Receipt string `json:"receipt"`
	Status  string `json:"status"`
}

// Ack acknowledges receipts. It is retried after a lost answer; a receipt
// the first attempt acked then answers "stale" (see docs/clients.md).
func (c *Client) Ack(ctx context.Context, topic, group string, receipts ...string) ([]ReceiptResult, error) {
	return c.receipts(ctx, topic, group, "ack", map[string]any{"receipts": receipts})
}

// NackOptions: Reason (kept in the message's history), NotRetryable to send
// the message to the dead-letter store at once, Delay to replace the
// backoff (nil: the computed backoff).
type NackOptions struct {
	Reason       string
	NotRetryable bool
	Delay        *time.Duration
}

// Nack reports receipts as failed.
func (c *Client) Nack(ctx context.Context, topic, group string, o NackOptions, receipts ...string) ([]ReceiptResult, error) {
	body := map[string]any{"receipts": receipts, "retryable": !o.NotRetryable}
	if o.Reason != "" {
		body["reason"] = o.Reason
	}
	if o.Delay != nil {
		body["delay_ms"] = max(0, o.Delay.Milliseconds())
	}
	return c.receipts(ctx, topic, group, "nack", body)
}

// Extend sets the leases of receipts to end lease from now.
func (c *Client) Extend(ctx context.Context, topic, group string, lease time.Duration, receipts ...string) ([]ReceiptResult, error) {
	return c.receipts(ctx, topic, group, "extend", map[string]any{"receipts": receipts, "lease_ms": max(1, lease.Milliseconds())})
}

func (c *Client) receipts(ctx context.Context, topic, group, op string, body map[string]any) ([]ReceiptResult, error) {
	var out struct {
		Results []ReceiptResult `json:"results"`
	}
	if _, err := c.call(ctx, http.MethodPost, groupPath(topic, group)+"/"+op, body, &out, retrySafe, 0); err != nil {
		return nil, err
	}
	if broken(breakHideStale) {
		for i := range out.Results {
			if out.Results[i].Status == StatusStale {
				out.Results[i].Status = StatusOK
			}
		}
	}
	return out.Results, nil
}
