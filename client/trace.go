package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// KeyTrace is where the message with an idempotency key is, and its state
// in each group (SPEC §11). Raw is the broker's answer.
type KeyTrace struct {
	Key         string              `json:"key"`
	Partition   uint32              `json:"partition"`
	Offset      uint64              `json:"offset"`
	PublishedAt string              `json:"published_at"`
	Duplicates  uint64              `json:"duplicates"`
	Groups      map[string]KeyGroup `json:"groups"`
	Raw         json.RawMessage     `json:"-"`
}

// KeyGroup is the key's message in one group.
type KeyGroup struct {
	State      string         `json:"state"` // pending, leased, delayed, acked, dead, skipped
	Deliveries uint64         `json:"deliveries"`
	History    []HistoryEntry `json:"history"`
}

// HistoryEntry is one failed delivery.
type HistoryEntry struct {
	At     string `json:"at"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Node   string `json:"node"`
}

// TraceKey answers where the message with idempotency key is in topic
// (an *Error with code key_not_found when the topic holds no such key).
func (c *Client) TraceKey(ctx context.Context, topic, key string) (*KeyTrace, error) {
	var out KeyTrace
	resp, err := c.call(ctx, http.MethodGet, "/v1/topics/"+esc(topic)+"/keys/"+esc(key), nil, &out, retrySafe, 0)
	if err != nil {
		return nil, err
	}
	out.Raw = resp.Body
	return &out, nil
}

// Reconciliation is the answer of Reconcile. Raw is the broker's answer.
type Reconciliation struct {
	Missing []string             `json:"missing"`
	Stored  int                  `json:"stored"`
	Groups  map[string]GroupKeys `json:"groups"`
	Raw     json.RawMessage      `json:"-"`
}

// GroupKeys are one group's stored keys by state.
type GroupKeys struct {
	Acked    []string `json:"acked"`
	Pending  []string `json:"pending"`
	InFlight []string `json:"in_flight"`
	Dead     []string `json:"dead"`
}

// Reconcile checks up to 10000 keys against topic: which were never
// stored, and per group (all, or only group when not empty) what became
// of the others.
func (c *Client) Reconcile(ctx context.Context, topic string, keys []string, group string) (*Reconciliation, error) {
	body := map[string]any{"keys": keys}
	if group != "" {
		body["group"] = group
	}
	var out Reconciliation
	resp, err := c.call(ctx, http.MethodPost, "/v1/topics/"+esc(topic)+"/reconcile", body, &out, retrySafe, 0)
	if err != nil {
		return nil, err
	}
	out.Raw = resp.Body
	return &out, nil
}
