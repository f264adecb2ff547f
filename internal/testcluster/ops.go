package testcluster

import (
	"context"
	"net/http"
	"net/url"
)

// Typed helpers for the common broker calls. Each returns the raw *Response
// too (nil when no answer arrived) so tests can look at statuses and headers;
// an unexpected status is a *StatusError.

func topicPath(topic string) string { return "/v1/topics/" + url.PathEscape(topic) }

func groupPath(topic, group string) string {
	return topicPath(topic) + "/groups/" + url.PathEscape(group)
}

// PutTopic creates or updates a topic; cfg may be nil. It expects 200 or 201.
func (n *Node) PutTopic(ctx context.Context, topic string, cfg map[string]any) (*Response, error) {
	if cfg == nil {
		cfg = map[string]any{}
	}
	r, err := n.Do(ctx, http.MethodPut, topicPath(topic), cfg, nil)
	if err != nil {
		return nil, err
	}
	return r, r.Expect(http.StatusOK, http.StatusCreated)
}

// Stats is GET /v1/topics/{topic}.
func (n *Node) Stats(ctx context.Context, topic string) (TopicStats, error) {
	var s TopicStats
	r, err := n.Do(ctx, http.MethodGet, topicPath(topic), nil, nil)
	if err != nil {
		return s, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return s, err
	}
	return s, r.JSON(&s)
}

// Publish posts one message; it expects 201 or 200 (duplicate).
func (n *Node) Publish(ctx context.Context, topic string, payload []byte, hdr map[string]string) (PublishResult, *Response, error) {
	var pr PublishResult
	r, err := n.Do(ctx, http.MethodPost, topicPath(topic)+"/messages", payload, hdr)
	if err != nil {
		return pr, nil, err
	}
	if err := r.Expect(http.StatusCreated, http.StatusOK); err != nil {
		return pr, r, err
	}
	return pr, r, r.JSON(&pr)
}

// Fetch leases messages to the caller; it expects 200.
func (n *Node) Fetch(ctx context.Context, topic, group string, req FetchRequest) ([]Message, *Response, error) {
	r, err := n.Do(ctx, http.MethodPost, groupPath(topic, group)+"/fetch", req, nil)
	if err != nil {
		return nil, nil, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return nil, r, err
	}
	var fr FetchResult
	return fr.Messages, r, r.JSON(&fr)
}

// Ack acknowledges receipts; it expects 200.
func (n *Node) Ack(ctx context.Context, topic, group string, receipts []string) ([]ReceiptResult, *Response, error) {
	return n.receipts(ctx, groupPath(topic, group)+"/ack", map[string]any{"receipts": receipts})
}

// Nack negatively acknowledges receipts; body fields beyond receipts go in extra.
func (n *Node) Nack(ctx context.Context, topic, group string, receipts []string, extra map[string]any) ([]ReceiptResult, *Response, error) {
	body := map[string]any{"receipts": receipts}
	for k, v := range extra {
		body[k] = v
	}
	return n.receipts(ctx, groupPath(topic, group)+"/nack", body)
}

// Extend extends the leases of receipts to leaseMs from now.
func (n *Node) Extend(ctx context.Context, topic, group string, receipts []string, leaseMs int) ([]ReceiptResult, *Response, error) {
	return n.receipts(ctx, groupPath(topic, group)+"/extend", map[string]any{"receipts": receipts, "lease_ms": leaseMs})
}

func (n *Node) receipts(ctx context.Context, path string, body any) ([]ReceiptResult, *Response, error) {
	r, err := n.Do(ctx, http.MethodPost, path, body, nil)
	if err != nil {
		return nil, nil, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return nil, r, err
	}
	var rr ReceiptResults
	return rr.Results, r, r.JSON(&rr)
}
