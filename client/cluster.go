package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// NodeInfo is one node of the cluster as GET /v1/cluster reports it.
type NodeInfo struct {
	ID            string `json:"id"`
	HTTPAddr      string `json:"http_addr"`
	RaftAddr      string `json:"raft_addr"`
	State         string `json:"state"`
	Voter         bool   `json:"voter"`
	LastContactMs *int64 `json:"last_contact_ms,omitempty"`
	// StateFormatMax is the highest replicated state format the node's
	// binary reads (0: older than formats, or unknown to the answering node).
	StateFormatMax int `json:"state_format_max"`
}

// ClusterStatus is the answer of GET /v1/cluster on the node that answered.
type ClusterStatus struct {
	Leader            *NodeInfo       `json:"leader"`
	Nodes             []NodeInfo      `json:"nodes"`
	Self              string          `json:"self"`
	AppliedIndex      uint64          `json:"applied_index"`
	CommitIndex       uint64          `json:"commit_index"`
	LastSnapshotIndex uint64          `json:"last_snapshot_index"`
	StateFormat       int             `json:"state_format"` // the replicated state's format, as the answering node applied it
	Raw               json.RawMessage `json:"-"`
}

// Cluster returns the leader and the nodes.
func (c *Client) Cluster(ctx context.Context) (*ClusterStatus, error) {
	resp, err := c.call(ctx, http.MethodGet, "/v1/cluster", nil, nil, retrySafe, 0)
	if err != nil {
		return nil, err
	}
	var s ClusterStatus
	if err := json.Unmarshal(resp.Body, &s); err != nil {
		return nil, err
	}
	s.Raw = resp.Body
	return &s, nil
}

// RemoveNode removes node id from the cluster. A retry after a lost answer
// may report not found for a removal that succeeded.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	_, err := c.call(ctx, http.MethodDelete, "/v1/cluster/nodes/"+esc(id), nil, nil, retrySafe, 0)
	return err
}
