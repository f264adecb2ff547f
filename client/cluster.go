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
	Groups            []GroupInfo     `json:"groups,omitempty"`
	Raw               json.RawMessage `json:"-"`
}

// GroupInfo is one data group (server flag --data-groups): its members,
// the first the preferred leader; its leader, when the answering node
// holds a replica; the topics placed in it.
type GroupInfo struct {
	ID      string   `json:"id"`
	Members []string `json:"members"`
	Leader  string   `json:"leader,omitempty"`
	Topics  int      `json:"topics"`
}

// Move is one data group replica moved (From, To), or a change of the
// group's preferred leader (Leader) alone.
type Move struct {
	Group  string `json:"group"`
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Leader string `json:"leader"`
}

// Drain moves every data group replica off node id (before removing it);
// the groups' leaders carry the moves out after the answer.
func (c *Client) Drain(ctx context.Context, id string) ([]Move, error) {
	var out struct {
		Moves []Move `json:"moves"`
	}
	_, err := c.call(ctx, http.MethodPost, "/v1/cluster/nodes/"+esc(id)+"/drain", nil, &out, retrySafe, 0)
	return out.Moves, err
}

// Rebalance evens out data group replicas and preferred leaders over the
// current nodes.
func (c *Client) Rebalance(ctx context.Context) ([]Move, error) {
	var out struct {
		Moves []Move `json:"moves"`
	}
	_, err := c.call(ctx, http.MethodPost, "/v1/cluster/rebalance", nil, &out, retrySafe, 0)
	return out.Moves, err
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
