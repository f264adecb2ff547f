package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// A new cluster whose members all run this binary switches to the newest
// state format: every node's status and /metrics report it, and the leader
// said so in its log.
func TestStateFormatRaised(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 60*time.Second)
	for _, n := range c.Nodes() {
		st, err := systest.WaitNodeStatus(ctx, n, fmt.Sprint("state_format ", fsm.StateFormat), func(st systest.NodeStatus) bool { return st.StateFormat == fsm.StateFormat })
		if err != nil {
			t.Fatal(err)
		}
		if st.StateFormatMax != fsm.StateFormat || st.ID != n.ID() {
			t.Fatalf("%s: status %+v, want state_format_max %d and its own id", n, st, fsm.StateFormat)
		}
		if v, ok := systest.MetricValue(systest.Scrape(ctx, t, n), "mqd_state_format", nil); !ok || v != fsm.StateFormat {
			t.Fatalf("%s: mqd_state_format = %v (present %v), want %d", n, v, ok, fsm.StateFormat)
		}
	}
	// /v1/cluster: the state's format, and what each member reads.
	_, err := tc.WaitView(ctx, c.Node(0), "state format raised, every member reading it", func(ci tc.ClusterInfo) bool {
		ok := ci.StateFormat == fsm.StateFormat && len(ci.Nodes) == 3
		for _, n := range ci.Nodes {
			ok = ok && n.StateFormatMax == fsm.StateFormat
		}
		return ok
	})
	if err != nil {
		t.Fatal(err)
	}
	said := 0
	for _, n := range c.Nodes() {
		b, err := os.ReadFile(n.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		said += strings.Count(string(b), "state format raised")
	}
	if said == 0 {
		t.Fatal("no node logged \"state format raised\"")
	}
}

// Once the cluster is in format 3, the leader refuses to add a node whose
// binary does not read it: here an HTTP server answering
// /v1/internal/status as a binary from before formats does, and a node
// that does not answer at all. The join is answered 409
// state_format_unsupported (also through a follower) and the
// configuration keeps its three members.
func TestJoinRefusedToOlderBinary(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 60*time.Second)
	leader, followers := tc.MustRoles(t, c)
	if _, err := tc.WaitView(ctx, leader, "state format raised", func(ci tc.ClusterInfo) bool { return ci.StateFormat == fsm.StateFormat }); err != nil {
		t.Fatal(err)
	}
	// A raft address nobody listens on: were the node added, the
	// configuration would show it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	raftAddr := ln.Addr().String()
	ln.Close()
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/internal/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "old", "http_addr": r.Host, "raft_addr": raftAddr,
			"bootstrapped": false, "leader_known": false, "state": "follower", "now_ms": time.Now().UnixMilli()})
	}))
	defer old.Close()
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := ln.Addr().String()
	ln.Close()
	for _, j := range []struct {
		via  *tc.Node
		info map[string]string
	}{
		{leader, map[string]string{"id": "old", "http_addr": old.Listener.Addr().String(), "raft_addr": raftAddr}},
		{followers[0], map[string]string{"id": "old", "http_addr": old.Listener.Addr().String(), "raft_addr": raftAddr}},
		{leader, map[string]string{"id": "silent", "http_addr": silent, "raft_addr": raftAddr}},
	} {
		r, err := j.via.Do(ctx, "POST", "/v1/internal/join", j.info, nil)
		if err != nil {
			t.Fatal(err)
		}
		code, cerr := r.CheckError()
		if r.Status != 409 || cerr != nil || code != "state_format_unsupported" {
			t.Fatalf("join of %s via %s: %d %s (%v), want 409 state_format_unsupported", j.info["id"], j.via, r.Status, r.Body, cerr)
		}
	}
	ci, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ci.Nodes) != 3 {
		t.Fatalf("after refused joins the cluster has %d members: %s", len(ci.Nodes), tc.DescribeCluster(ci))
	}
}
