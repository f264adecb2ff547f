package raftfsm

import (
	"sync"
	"time"
)

// Every node knows every data group's leader, including the groups it
// holds no replica of: each probe answer (Status.Leads) names the data
// groups the answering node leads with the raft term it leads them in, and
// a node keeps, per group, the claim of the highest term (raft elects at
// most one leader per term), as long as it was answered within probeStale.
// A member whose status has no leads (a binary without them) is simply not
// a source: the groups it leads stay unknown to the nodes outside them,
// which forward to the members in order instead (api/views.go).

// leaderClaim is one node's latest claim to lead a data group.
type leaderClaim struct {
	node string
	term uint64
	seen time.Time // when the node last made it (local monotonic time)
}

// leaderTable is, per data group, the leader this node learned from its
// peers' probe answers.
type leaderTable struct {
	mu sync.Mutex
	m  map[string]leaderClaim
}

// observe records the probe answer node gave at time at: leads are the
// groups it leads, with their term. A claim replaces a group's entry when
// its term is higher, when it renews the entry (same node, same term), or
// when the entry is stale; a node that no longer claims a group it was
// recorded as leading (it stepped down) loses the entry at once.
func (t *leaderTable) observe(node string, leads map[string]uint64, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]leaderClaim{}
	}
	for g, c := range t.m {
		term, claims := leads[g]
		switch {
		case at.Sub(c.seen) >= probeStale:
			delete(t.m, g)
		case c.node == node && (!claims || term < c.term):
			delete(t.m, g)
		}
	}
	for g, term := range leads {
		c, ok := t.m[g]
		if !ok || term > c.term || (term == c.term && c.node == node) {
			t.m[g] = leaderClaim{node: node, term: term, seen: at}
		}
	}
}

// leader is the node that leads data group id by the latest claims, if a
// claim was made within probeStale of now.
func (t *leaderTable) leader(id string, now time.Time) (node string, term uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.m[id]
	if !ok || now.Sub(c.seen) >= probeStale {
		return "", 0, false
	}
	return c.node, c.term, true
}

// leads are the data groups this node leads, with their raft terms (its
// Status.Leads).
func (n *Node) leads() map[string]uint64 {
	var out map[string]uint64
	for id, g := range n.DataGroups() {
		if term, ok := g.LeaderTerm(); ok {
			if out == nil {
				out = map[string]uint64{}
			}
			out[id] = term
		}
	}
	return out
}

// GroupLeader is data group id's leader, its id and HTTP address: by raft
// when this node holds a replica that knows it, else by the probe answers
// of the other nodes (the one that claims it with the highest term).
func (n *Node) GroupLeader(id string) (leader, httpAddr string, ok bool) {
	if g := n.Group(id); g != nil {
		if leader, httpAddr, ok = n.View(g).Leader(); ok {
			return leader, httpAddr, true
		}
	}
	leader, _, ok = n.leaders.leader(id, time.Now())
	if !ok {
		return "", "", false
	}
	info, ok := n.FSM.Node(leader)
	return leader, info.HTTPAddr, ok && info.HTTPAddr != ""
}
