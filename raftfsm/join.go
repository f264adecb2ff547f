package raftfsm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// Status is what a node tells peers that are forming or joining a cluster
// (GET /v1/internal/status).
type Status struct {
	command.NodeInfo
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
	// DiskLow: the node's data dir has less free space than its
	// --min-free-disk; the leader then refuses writes that add data.
	DiskLow bool `json:"disk_low"`
	// DiskFree and DiskKeep: the free bytes on the node's data dir and
	// what it keeps free (its floor); the leader counts the bytes it
	// admits between two probes against the least margin (disk.go).
	DiskFree uint64 `json:"disk_free,omitempty"`
	DiskKeep uint64 `json:"disk_keep,omitempty"`
	// Groups: the applied index of each data group this node holds (a
	// group's leader promotes a new member once it caught up: moves.go).
	Groups map[string]uint64 `json:"groups,omitempty"`
	// Leads: the data groups this node leads, with the raft term of its
	// leadership; every node learns each group's leader from them
	// (leaders.go). A binary without them sends none.
	Leads map[string]uint64 `json:"leads,omitempty"`
}

// Status reports this node's membership state.
func (n *Node) Status() Status {
	servers, _ := n.Servers()
	_, _, known := n.Leader()
	st := Status{NodeInfo: n.Info(), Bootstrapped: len(servers) > 0, LeaderKnown: known, State: n.StateName(),
		AppliedIndex: n.FSM.AppliedIndex(), CommitIndex: n.CommitIndex(), LastContactMs: n.LastContactMs(),
		NowMs: Wall().UnixMilli(), Stopping: n.HandingOff(), StateFormatMax: fsm.StateFormat, StateFormat: n.FSM.StateFormat(),
		DiskLow: n.disk.lowNow(), DiskKeep: n.disk.need.Load()}
	for id, g := range n.DataGroups() {
		if st.Groups == nil {
			st.Groups = map[string]uint64{}
		}
		st.Groups[id] = g.FSM().AppliedIndex()
	}
	st.Leads = n.leads()
	if st.DiskKeep > 0 {
		st.DiskFree = n.disk.free.Load()
	}
	return st
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
	if !n.def.HadState() && len(peers) == 0 {
		if err := n.Bootstrap([]command.NodeInfo{n.Info()}); err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
	}
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	var warned time.Time
	for {
		if n.recorded() {
			if !warned.IsZero() {
				n.logger.Info("address recorded in the cluster state", "after", time.Since(start).Round(time.Second))
			}
			return nil
		}
		// Until its address is recorded no node forwards to this one or
		// probes it: say why, a while after start and every so often.
		if err := n.formStep(ctx, client, peers, expect); err != nil && time.Since(start) >= formWarnAfter && time.Since(warned) >= formWarnEvery {
			n.logger.Warn("not in the cluster state yet: still trying", "waiting", time.Since(start).Round(time.Second), "err", err)
			warned = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// A node not recorded formWarnAfter after start says why, every
// formWarnEvery.
const (
	formWarnAfter = 10 * time.Second
	formWarnEvery = 30 * time.Second
)

func (n *Node) recorded() bool {
	return n.FSM.Nodes()[n.cfg.ID] == n.Info()
}

// formStep takes one step toward being recorded; its error says what
// stands in the way.
func (n *Node) formStep(ctx context.Context, client *http.Client, peers []string, expect int) error {
	if _, _, ok := n.Leader(); ok {
		// In a cluster: ask the leader (through any node) to record us.
		if n.IsLeader() {
			return errors.New("leading, and recording its own address") // the leader loop does
		}
		var errs []error
		for _, p := range append([]string{n.cfg.HTTPAddr}, peers...) {
			err := n.postJoin(ctx, client, p, n.Info())
			if err == nil {
				return nil
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	if n.Status().Bootstrapped || len(peers) == 0 {
		return errors.New("in a cluster, but no leader with a recorded address is known") // an election
	}
	found := []command.NodeInfo{n.Info()}
	var errs []error
	for _, p := range peers {
		if p == n.cfg.HTTPAddr {
			continue
		}
		st, err := n.getStatus(ctx, client, p)
		if err == nil && st.ID == n.cfg.ID {
			err = fmt.Errorf("%s answers with this node's own id %q", p, st.ID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("status of %s: %w", p, err))
			continue
		}
		if st.Bootstrapped {
			return n.postJoin(ctx, client, p, n.Info())
		}
		found = append(found, st.NodeInfo)
	}
	if expect > 0 && len(found) >= expect {
		slices.SortFunc(found, func(a, b command.NodeInfo) int { return cmpStr(a.ID, b.ID) })
		found = found[:expect]
		if !slices.ContainsFunc(found, func(x command.NodeInfo) bool { return x.ID == n.cfg.ID }) {
			return errors.New("waiting for the nodes with the lowest ids to bootstrap the cluster")
		}
		n.logger.Info("bootstrapping cluster", "servers", len(found))
		if err := n.Bootstrap(found); err != nil {
			n.logger.Error("bootstrap", "err", err)
			return fmt.Errorf("bootstrap: %w", err)
		}
		return nil
	}
	if expect > 0 {
		return fmt.Errorf("no cluster found through --join, and %d of --bootstrap-expect %d nodes answer: %w", len(found), expect, errors.Join(errs...))
	}
	return fmt.Errorf("no cluster found through --join: %w", errors.Join(errs...))
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
		return st, answerError(resp)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (n *Node) postJoin(ctx context.Context, c *http.Client, addr string, info command.NodeInfo) error {
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
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("join via %s: %w", addr, answerError(resp))
	}
	return nil
}

// answerError describes a peer's error answer: its status and the start
// of its body (the JSON error, which names the reason).
func answerError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
	return fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
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
	// A transport of its own: closing its idle connections leaves the
	// process's others alone, and node-to-node calls never go through an
	// HTTP_PROXY.
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	if n.cfg.TLS != nil {
		tr.DialTLSContext = n.cfg.TLS.DialContext
	}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// peerURL is the URL of path on a peer's HTTP address.
func (n *Node) peerURL(addr, path string) string {
	if n.cfg.TLS != nil {
		return "https://" + addr + path
	}
	return "http://" + addr + path
}
