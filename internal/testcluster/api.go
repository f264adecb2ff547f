package testcluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// ClusterInfo is the answer of GET /v1/cluster.
type ClusterInfo struct {
	Leader            *NodeInfo  `json:"leader"`
	Nodes             []NodeInfo `json:"nodes"`
	AppliedIndex      uint64     `json:"applied_index"`
	CommitIndex       uint64     `json:"commit_index"`
	LastSnapshotIndex uint64     `json:"last_snapshot_index"`
	StateFormat       int        `json:"state_format"`
	Self              string     `json:"self"` // the answering node's id
}

// LeaderID is the id of the leader this node knows, or "" if none.
func (c ClusterInfo) LeaderID() string {
	if c.Leader == nil {
		return ""
	}
	return c.Leader.ID
}

// NodeInfo is one node in ClusterInfo.
type NodeInfo struct {
	ID       string `json:"id"`
	HTTPAddr string `json:"http_addr"`
	RaftAddr string `json:"raft_addr"`
	State    string `json:"state"`
	Voter    bool   `json:"voter"`
	// LastContactMs: for the answering node itself, the time since it heard
	// from the leader (0 on the leader); for others, since it heard from them.
	LastContactMs int64  `json:"last_contact_ms"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	// StateFormatMax: the highest state format the node's binary reads.
	StateFormatMax int `json:"state_format_max"`
}

// PublishResult is the answer of a publish.
type PublishResult struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	Duplicate bool   `json:"duplicate"`
}

// FetchRequest is the body of a fetch; zero fields are left out.
type FetchRequest struct {
	Max     int `json:"max,omitempty"`
	WaitMs  int `json:"wait_ms,omitempty"`
	LeaseMs int `json:"lease_ms,omitempty"`
}

// Message is one fetched message.
type Message struct {
	Topic          string            `json:"topic"`
	Partition      int               `json:"partition"`
	Offset         int64             `json:"offset"`
	Receipt        string            `json:"receipt"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	RetryCount     int               `json:"retry_count"`
	MaxRetry       int               `json:"max_retry"`
	RejectReason   string            `json:"reject_reason"`
	PublishedAt    string            `json:"published_at"`
	Attrs          map[string]string `json:"attrs"`
}

// Value decodes ValueB64 (standard base64, padded or not).
func (m Message) Value() ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(m.ValueB64); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(m.ValueB64)
}

// FetchResult is the answer of a fetch.
type FetchResult struct {
	Messages []Message `json:"messages"`
}

// ReceiptResult is one entry of an ack, nack or extend answer.
type ReceiptResult struct {
	Receipt string `json:"receipt"`
	Status  string `json:"status"`
}

// ReceiptResults is the answer of ack, nack and extend.
type ReceiptResults struct {
	Results []ReceiptResult `json:"results"`
}

// Reconciliation is POST /v1/topics/{topic}/reconcile's answer: the keys
// never stored, and per group the keys acked, pending, in flight and dead.
type Reconciliation struct {
	Missing []string `json:"missing"`
	Stored  int      `json:"stored"`
	Groups  map[string]struct {
		Acked    []string `json:"acked"`
		Pending  []string `json:"pending"`
		InFlight []string `json:"in_flight"`
		Dead     []string `json:"dead"`
	} `json:"groups"`
}

// TopicStats is the answer of GET /v1/topics/{topic}.
type TopicStats struct {
	Name       string                     `json:"name"`
	Config     map[string]json.RawMessage `json:"config"`
	Messages   int64                      `json:"messages"`
	Bytes      int64                      `json:"bytes"`
	Partitions []PartitionStats           `json:"partitions"`
	Groups     map[string]GroupStats      `json:"groups"`
}

// NextOffsets is the sum of next_offset over all partitions: the number of
// messages ever stored in the topic.
func (s TopicStats) NextOffsets() int64 {
	var n int64
	for _, p := range s.Partitions {
		n += p.NextOffset
	}
	return n
}

// PartitionStats is one partition in TopicStats.
type PartitionStats struct {
	Partition   int   `json:"partition"`
	FirstOffset int64 `json:"first_offset"`
	NextOffset  int64 `json:"next_offset"`
	Messages    int64 `json:"messages"`
}

// GroupStats is one consumer group in TopicStats.
type GroupStats struct {
	Backlog           int64 `json:"backlog"`
	InFlight          int64 `json:"in_flight"`
	Delayed           int64 `json:"delayed"`
	DLQ               int64 `json:"dlq"`
	Acked             int64 `json:"acked"`
	DuplicatesSkipped int64 `json:"duplicates_skipped"`
	ReplayPending     int64 `json:"replay_pending"`
}

// ErrorBody is the JSON body of every error answer.
type ErrorBody struct {
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// StatusError is returned by the typed helpers when the broker answers with an
// unexpected status.
type StatusError struct {
	Method, URL string
	Status      int
	Code        string // error.code from the body, if it parsed
	Body        string
}

func (e *StatusError) Error() string {
	body := e.Body
	if len(body) > 300 {
		body = body[:300] + "..."
	}
	return fmt.Sprintf("%s %s: status %d: %s", e.Method, e.URL, e.Status, body)
}
