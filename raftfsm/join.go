package raftfsm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Status is what a node tells peers that are forming or joining a cluster
// (GET /v1/internal/status).
type Status struct {
	NodeInfo
	Bootstrapped  bool   `json:"bootstrapped"`
	LeaderKnown   bool   `json:"leader_known"`
	State         string `json:"state"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	LastContactMs int64  `json:"last_contact_ms"` // with the leader; 0 on the leader, -1 never
	NowMs         int64  `json:"now_ms"`          // this node's wall clock (unix ms), for offset measurement
	Stopping      bool   `json:"stopping"`        // handing leadership off to stop: not a transfer target
	// StateFormatMax is the highest state format this node's binary reads
	// (StateFormat); StateFormat the replicated state's, as this node
	// applied it. A binary older than formats sends neither: 0.
	StateFormatMax int `json:"state_format_max"`
	StateFormat    int `json:"state_format"`
}

// Status reports this node's membership state.
func (n *Node) Status() Status {
	servers, _ := n.Servers()
	_, _, known := n.Leader()
	return Status{NodeInfo: n.Info(), Bootstrapped: len(servers) > 0, LeaderKnown: known, State: n.StateName(),
		AppliedIndex: n.FSM.AppliedIndex(), CommitIndex: n.Raft.CommitIndex(), LastContactMs: n.LastContact().Milliseconds(),
		NowMs: Now().UnixMilli(), Stopping: n.HandingOff(), StateFormatMax: StateFormat, StateFormat: n.FSM.StateFormat()}
}

// Form brings the node into a cluster and returns when its address is
// recorded in the replicated state, or when ctx ends.
//   - no peers: a node without state bootstraps a single-node cluster;
//   - expect > 0: nodes without state wait until expect of them (this one
//     included) answer and none is in a cluster yet, then all bootstrap the
//     same configuration (the expect lowest ids); a node that finds a peer
//     already in a cluster joins it instead;
//   - a node with state just runs: raft knows its peers.
//
// Every node then makes sure the leader has recorded its HTTP address.
func (n *Node) Form(ctx context.Context, peers []string, expect int) error {
	n.joinPeers.Store(peers)
	client := n.peerClient(2 * time.Second)
	defer client.CloseIdleConnections()
	if !n.hadState && len(peers) == 0 {
		if err := n.Bootstrap([]NodeInfo{n.Info()}); err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
	}
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		if n.recorded() {
			return nil
		}
		n.formStep(ctx, client, peers, expect)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (n *Node) recorded() bool {
	return n.FSM.Nodes()[n.cfg.ID] == n.Info()
}

func (n *Node) formStep(ctx context.Context, client *http.Client, peers []string, expect int) {
	if _, _, ok := n.Leader(); ok {
		// In a cluster: ask the leader (through any node) to record us.
		if n.IsLeader() {
			return // the leader loop records itself
		}
		for _, p := range append([]string{n.cfg.HTTPAddr}, peers...) {
			if n.postJoin(ctx, client, p, n.Info()) == nil {
				return
			}
		}
		return
	}
	if n.Status().Bootstrapped || len(peers) == 0 {
		return // waiting for an election
	}
	found := []NodeInfo{n.Info()}
	for _, p := range peers {
		if p == n.cfg.HTTPAddr {
			continue
		}
		st, err := n.getStatus(ctx, client, p)
		if err != nil || st.ID == n.cfg.ID {
			continue
		}
		if st.Bootstrapped {
			if err := n.postJoin(ctx, client, p, n.Info()); err != nil {
				n.logger.Debug("join", "peer", p, "err", err)
			}
			return
		}
		found = append(found, st.NodeInfo)
	}
	if expect > 0 && len(found) >= expect {
		slices.SortFunc(found, func(a, b NodeInfo) int { return cmpStr(a.ID, b.ID) })
		found = found[:expect]
		if !slices.ContainsFunc(found, func(x NodeInfo) bool { return x.ID == n.cfg.ID }) {
			return
		}
		n.logger.Info("bootstrapping cluster", "servers", len(found))
		if err := n.Bootstrap(found); err != nil {
			n.logger.Error("bootstrap", "err", err)
		}
	}
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (n *Node) getStatus(ctx context.Context, c *http.Client, addr string) (Status, error) {
	var st Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.peerURL(addr, "/v1/internal/status"), nil)
	if err != nil {
		return st, err
	}
	n.nodeAuth(req)
	resp, err := c.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status %d", resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (n *Node) postJoin(ctx context.Context, c *http.Client, addr string, info NodeInfo) error {
	body, _ := json.Marshal(info)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.peerURL(addr, "/v1/internal/join"), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	n.nodeAuth(req)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("join via %s: status %d", addr, resp.StatusCode)
	}
	return nil
}

// nodeAuth adds the node token to a node-to-node request, if there is one.
func (n *Node) nodeAuth(req *http.Request) {
	if n.cfg.NodeToken != "" {
		req.Header.Set("Authorization", "Bearer "+n.cfg.NodeToken)
	}
}

// peerClient is the HTTP client for node-to-node calls (join, status
// probes): mutual TLS with the cluster's certificates when TLS is on.
func (n *Node) peerClient(timeout time.Duration) *http.Client {
	if n.cfg.TLS == nil {
		return &http.Client{Timeout: timeout}
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		Proxy:               nil,
		DialTLSContext:      n.cfg.TLS.DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// peerURL is the URL of path on a peer's HTTP address.
func (n *Node) peerURL(addr, path string) string {
	if n.cfg.TLS != nil {
		return "https://" + addr + path
	}
	return "http://" + addr + path
}
