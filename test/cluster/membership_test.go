package cluster

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// /v1/cluster reports each node's real state; a killed leader is soon
// shown unreachable and no longer named leader; DELETE
// /v1/cluster/nodes/{id} (through a follower) removes it; a fresh node
// with a new id and an empty dir joins, and the cluster has three healthy
// voters again that still hold every acknowledged message.
func TestClusterHealthAndReplace(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader := tc.MustLeader(t, c)
	tc.MustTopic(t, leader, "mem", nil)
	want := map[string]bool{}
	for i := range 5 {
		k := fmt.Sprintf("m%d", i)
		want[k] = true
		tc.MustPublish(t, leader, "mem", k, map[string]string{"Idempotency-Key": k})
	}
	all := map[string]bool{"n1": true, "n2": true, "n3": true}
	for _, n := range c.Nodes() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ci, err := tc.WaitView(wctx, n, "three healthy voters", systest.Healthy(all))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if ci.LeaderID() != leader.ID() {
			t.Fatalf("%s names leader %s, want %s", n, ci.LeaderID(), leader.ID())
		}
	}

	// Kill the leader: the others stop naming it and show it unreachable.
	dead := leader.ID()
	leader.Kill()
	killed := time.Now()
	var rest []*tc.Node
	for _, n := range c.Nodes() {
		if n.ID() != dead {
			rest = append(rest, n)
		}
	}
	for _, n := range rest {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := tc.WaitView(wctx, n, "the killed leader unreachable and not named leader", func(ci tc.ClusterInfo) bool {
			for _, x := range ci.Nodes {
				if x.ID == dead {
					return x.State == "unreachable" && ci.LeaderID() != dead
				}
			}
			return false
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("killed leader %s shown unreachable by both others %v after the kill", dead, time.Since(killed).Round(time.Millisecond))

	tc.MustLeader(t, c)
	follower := rest[0]
	if l, _ := c.Leader(ctx); l == follower {
		follower = rest[1]
	}
	r, err := follower.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/nope", nil, nil)
	systest.ExpectCode(t, "remove an unknown node", r, err, 404, "node_not_found")
	r, err = follower.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/"+dead, nil, nil)
	systest.ExpectCode(t, "remove the dead node through a follower", r, err, 200, "")
	r, err = follower.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/"+dead, nil, nil)
	systest.ExpectCode(t, "remove it again", r, err, 404, "node_not_found")
	two := map[string]bool{rest[0].ID(): true, rest[1].ID(): true}
	if _, err := tc.WaitView(ctx, follower, "two healthy voters", systest.Healthy(two)); err != nil {
		t.Fatal(err)
	}

	// Replace it: a new id, an empty data dir.
	n4 := c.AddNode("n4")
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("cluster with n4 not ready: %v", err)
	}
	three := map[string]bool{rest[0].ID(): true, rest[1].ID(): true, "n4": true}
	for _, n := range append(rest, n4) {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := tc.WaitView(wctx, n, "three healthy voters with n4", systest.Healthy(three))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := tc.Drain(ctx, n4, "mem", "g", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range msgs {
		got[m.IdempotencyKey] = true
	}
	for k := range want {
		if !got[k] {
			t.Fatalf("acknowledged %s missing after the replacement (got %v)", k, got)
		}
	}
	tc.MustPublish(t, n4, "mem", "after", nil)
}

// A join under the id of a member that is running elsewhere is refused
// (409 node_id_in_use, also through a follower) and the member keeps its
// addresses; without the check the leader rewrote the member's address
// to the newcomer's, leaving the configuration naming a node that is not
// there while the real member went on as a follower.
func TestJoinUnderLiveMemberIDRefused(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 60*time.Second)
	leader, followers := tc.MustRoles(t, c)
	// Every member answering, with both its addresses recorded (a member
	// records its HTTP address once the cluster has formed: taken before,
	// the "before" view would differ from the "after" by that alone).
	before, err := tc.WaitView(ctx, leader, "every member answering, its addresses recorded", func(ci tc.ClusterInfo) bool {
		for _, n := range ci.Nodes {
			if (n.State != "leader" && n.State != "follower") || n.HTTPAddr == "" || n.RaftAddr == "" {
				return false
			}
		}
		return len(ci.Nodes) == 3
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other := ln.Addr().String()
	ln.Close()
	for _, j := range []struct{ via, taken *tc.Node }{{leader, followers[0]}, {followers[1], followers[0]}, {leader, leader}} {
		info := map[string]string{"id": j.taken.ID(), "http_addr": other, "raft_addr": other}
		r, err := j.via.Do(ctx, "POST", "/v1/internal/join", info, nil)
		if err != nil {
			t.Fatal(err)
		}
		code, cerr := r.CheckError()
		if r.Status != 409 || cerr != nil || code != "node_id_in_use" {
			t.Fatalf("join under %s's id via %s: %d %s (%v), want 409 node_id_in_use", j.taken, j.via, r.Status, r.Body, cerr)
		}
	}
	// A new member's id must be one a URL carries as it is.
	r, err := leader.Do(ctx, "POST", "/v1/internal/join", map[string]string{"id": "n 4", "http_addr": other, "raft_addr": other}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, cerr := r.CheckError(); r.Status != 400 || cerr != nil || code != "bad_request" || !strings.Contains(string(r.Body), "invalid node id") {
		t.Fatalf("join under id \"n 4\": %d %s (%v), want 400 bad_request naming the invalid id", r.Status, r.Body, cerr)
	}
	after, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addrs := func(ci tc.ClusterInfo) map[string]string {
		m := map[string]string{}
		for _, n := range ci.Nodes {
			m[n.ID] = n.HTTPAddr + " " + n.RaftAddr
		}
		return m
	}
	if !maps.Equal(addrs(before), addrs(after)) {
		t.Fatalf("members' addresses changed by refused joins: before %v, after %v", addrs(before), addrs(after))
	}
}

// Removing the only voter is refused at once (409 last_voter), not retried
// as a 503 no_quorum that no retry could cure, and the node carries on.
func TestRemoveOnlyVoterRefused(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := tc.CtxFor(t, 30*time.Second)
	n := tc.MustLeader(t, c)
	r, err := n.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/"+n.ID(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, cerr := r.CheckError(); r.Status != 409 || cerr != nil || code != "last_voter" {
		t.Fatalf("removing the only voter: %d %s (%v), want 409 last_voter", r.Status, r.Body, cerr)
	}
	tc.MustTopic(t, n, "after-remove", nil)
	tc.MustPublish(t, n, "after-remove", "still serving", nil)
}

// A follower restarted on its data dir answers /readyz 200 only once it has
// applied what was committed while it was down: the rolling-upgrade
// procedure waits on it. Raft's commit index starts at 0 after a restart,
// so "applied >= commit" held before the leader had told it anything, and
// /readyz answered 200 a few entries behind (6 of 8 restarts in the
// runbook audit). Even once told, a follower's commit index is capped at
// the last entry it has received: one more than an append (64 entries)
// behind counted itself caught up between two appends. Each round leaves
// it 150 entries behind (the publishes are sequential: one entry each).
// The odd rounds pause the follower (SIGSTOP) instead of restarting it, as
// a VM freeze or a partition would: it kept its commit index, and counted
// itself caught up by it as soon as it ran again.
func TestRestartedFollowerReadyOnlyWhenCaughtUp(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "rr", nil)
	f := followers[0]
	for round := range 4 {
		// Each round its own deadline: after a restart the leader's next
		// append may wait out raft's backoff (up to about 10 s).
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		paused := round%2 == 1
		if paused {
			f.Pause()
		} else if err := f.Stop(); err != nil {
			t.Fatal(err)
		}
		for i := range 150 {
			tc.MustPublish(t, leader, "rr", fmt.Sprintf("r%d-%d", round, i), nil)
		}
		ci, err := leader.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		committed := ci.CommitIndex
		if paused {
			f.Resume()
		} else {
			f.Restart()
		}
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			ready := f.Ready(rctx)
			cancel()
			if ready {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("restarted follower never ready")
			}
			time.Sleep(5 * time.Millisecond)
		}
		r, err := f.Do(ctx, http.MethodGet, "/v1/internal/status", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			AppliedIndex uint64 `json:"applied_index"`
			CommitIndex  uint64 `json:"commit_index"`
		}
		if err := r.JSON(&st); err != nil {
			t.Fatal(err)
		}
		if st.AppliedIndex < committed {
			t.Fatalf("round %d (paused %v): %s answered /readyz 200 with applied %d (commit %d), behind the %d committed before it came back", round, paused, f, st.AppliedIndex, st.CommitIndex, committed)
		}
	}
}
