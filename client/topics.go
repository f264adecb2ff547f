package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// TopicConfig holds topic settings by their API names (partitions,
// max_retry, ack_timeout_ms, ...; see docs/API.md). On create or update,
// the fields present replace the topic's, absent ones keep their value.
type TopicConfig map[string]any

// Topic is a topic's config and live stats.
type Topic struct {
	Name       string                `json:"name"`
	Config     map[string]any        `json:"config"`
	Messages   uint64                `json:"messages"`
	Bytes      uint64                `json:"bytes"`
	Partitions []PartitionStats      `json:"partitions"`
	Groups     map[string]GroupStats `json:"groups"`
	// Raw is the answer's JSON for this topic as the broker sent it.
	Raw json.RawMessage `json:"-"`
}

// PartitionStats are one partition's offsets; NextOffset is exclusive.
type PartitionStats struct {
	Partition   uint32 `json:"partition"`
	FirstOffset uint64 `json:"first_offset"`
	NextOffset  uint64 `json:"next_offset"`
	Messages    uint64 `json:"messages"`
}

// GroupStats are one consumer group's counters on a topic.
type GroupStats struct {
	Backlog           uint64 `json:"backlog"`
	InFlight          uint64 `json:"in_flight"`
	Delayed           uint64 `json:"delayed"`
	DLQ               uint64 `json:"dlq"`
	Acked             uint64 `json:"acked"`
	DuplicatesSkipped uint64 `json:"duplicates_skipped"`
	ReplayPending     uint64 `json:"replay_pending"`
}

func (t *Topic) UnmarshalJSON(b []byte) error {
	type plain Topic
	if err := json.Unmarshal(b, (*plain)(t)); err != nil {
		return err
	}
	t.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// PutTopic creates topic name or updates its config (cfg may be nil) and
// reports whether it was created. Sending it twice is harmless, so it is
// retried like a read.
func (c *Client) PutTopic(ctx context.Context, name string, cfg TopicConfig) (*Topic, bool, error) {
	if cfg == nil {
		cfg = TopicConfig{}
	}
	var t Topic
	resp, err := c.call(ctx, http.MethodPut, "/v1/topics/"+esc(name), cfg, &t, retrySafe, 0)
	if err != nil {
		return nil, false, err
	}
	return &t, resp.Status == http.StatusCreated, nil
}

// Topics lists every topic with its stats, following the server's pages.
func (c *Client) Topics(ctx context.Context) ([]Topic, error) {
	var all []Topic
	after := ""
	for {
		q := url.Values{}
		if after != "" {
			q.Set("after", after)
		}
		resp, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/topics", query: q, policy: retrySafe})
		if err != nil {
			return nil, err
		}
		var page struct {
			Topics []Topic `json:"topics"`
			Next   string  `json:"next"`
		}
		if err := json.Unmarshal(resp.Body, &page); err != nil {
			return nil, fmt.Errorf("GET /v1/topics: %w", err)
		}
		all = append(all, page.Topics...)
		if page.Next == "" || len(page.Topics) == 0 {
			return all, nil
		}
		after = page.Next
	}
}

// Topic returns one topic's config and stats.
func (c *Client) Topic(ctx context.Context, name string) (*Topic, error) {
	var t Topic
	if _, err := c.call(ctx, http.MethodGet, "/v1/topics/"+esc(name), nil, &t, retrySafe, 0); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTopic deletes a topic with all its data. A retry after a lost
// answer may report topic_not_found for a delete that succeeded.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	_, err := c.call(ctx, http.MethodDelete, "/v1/topics/"+esc(name), nil, nil, retrySafe, 0)
	return err
}

// PutGroup creates a consumer group ahead of its first fetch.
func (c *Client) PutGroup(ctx context.Context, topic, group string) error {
	_, err := c.call(ctx, http.MethodPut, groupPath(topic, group), nil, nil, retrySafe, 0)
	return err
}

// DeleteGroup removes a consumer group with its leases.
func (c *Client) DeleteGroup(ctx context.Context, topic, group string) error {
	_, err := c.call(ctx, http.MethodDelete, groupPath(topic, group), nil, nil, retrySafe, 0)
	return err
}

func groupPath(topic, group string) string {
	return "/v1/topics/" + esc(topic) + "/groups/" + esc(group)
}
