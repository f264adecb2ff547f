package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
)

// DeadLetter is a message in a group's dead-letter store.
type DeadLetter struct {
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
	History        []Failure         `json:"history"`
}

// Failure is one failed delivery in a dead letter's history.
type Failure struct {
	At     string `json:"at"`
	Kind   string `json:"kind"` // nack, lease_expired, rejected
	Reason string `json:"reason"`
	Node   string `json:"node"`
}

// DLQPage is one page of dead letters; NextAfter is nil on the last page.
type DLQPage struct {
	DeadLetters []DeadLetter    `json:"dead_letters"`
	NextAfter   *uint64         `json:"next_after"`
	Raw         json.RawMessage `json:"-"`
}

// DLQOptions page a dead-letter listing: Limit (default the broker's 100),
// After (an id; 0 from the start), IdempotencyKey to filter on.
type DLQOptions struct {
	Limit          int
	After          uint64
	IdempotencyKey string
}

// DeadLetters lists a page of group's dead letters, oldest first.
func (c *Client) DeadLetters(ctx context.Context, topic, group string, o DLQOptions) (*DLQPage, error) {
	q := url.Values{}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.After > 0 {
		q.Set("after", strconv.FormatUint(o.After, 10))
	}
	if o.IdempotencyKey != "" {
		q.Set("idempotency_key", o.IdempotencyKey)
	}
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: groupPath(topic, group) + "/dlq", query: q, policy: retrySafe})
	if err != nil {
		return nil, err
	}
	var p DLQPage
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		return nil, err
	}
	p.Raw = resp.Body
	return &p, nil
}

// ReplayResult is the broker's answer to a replay.
type ReplayResult struct {
	Accepted   int             `json:"accepted"`     // dead letters put back
	RatePerSec int             `json:"rate_per_sec"` // the rate they are delivered at
	Raw        json.RawMessage `json:"-"`
}

// Replay puts dead letters back into the group's delivery: the given ids,
// or all of them when ids is empty, at ratePerSec (0: the broker's default).
// It answers how many the broker accepted and at what rate; the replay
// proceeds in the background. It is not retried once sent (a second replay
// of "all" could replay letters that died since).
func (c *Client) Replay(ctx context.Context, topic, group string, ids []uint64, ratePerSec int) (*ReplayResult, error) {
	body := map[string]any{}
	if len(ids) == 0 {
		body["all"] = true
	} else {
		body["ids"] = ids
	}
	if ratePerSec > 0 {
		body["rate_per_sec"] = ratePerSec
	}
	var r ReplayResult
	resp, err := c.call(ctx, http.MethodPost, groupPath(topic, group)+"/dlq/replay", body, &r, retryUnsent, 0)
	if err != nil {
		return nil, err
	}
	r.Raw = resp.Body
	return &r, nil
}

// DeleteDeadLetter discards one dead letter.
func (c *Client) DeleteDeadLetter(ctx context.Context, topic, group string, id uint64) error {
	_, err := c.call(ctx, http.MethodDelete, groupPath(topic, group)+"/dlq/"+strconv.FormatUint(id, 10), nil, nil, retrySafe, 0)
	return err
}
