package raftfsm

import (
	"time"

	"github.com/hashicorp/raft"
)

// The node's part in a hand-off of leadership (replica/handoff.go): which
// voter to hand it to (a group's Hooks.TransferTarget).

// transferTarget picks the best target among servers: a voter this node
// can reach, that is not stopping, whose clock is within
// --max-clock-offset of the cluster's, and that has applied the most;
// none (raft's own choice, the most up to date follower) when there is
// none. Raft's choice alone could pick a node that hands it straight back
// (a stopping node, a node whose clock is off), and the two would bounce
// it.
func (n *Node) transferTarget(servers []raft.Server) (raft.ServerID, raft.ServerAddress, bool) {
	cluster := n.Clock().Offset.Milliseconds() // this node's clock minus the cluster's
	max := n.cfg.MaxClockOffset.Milliseconds()
	var best raft.Server
	var bestApplied uint64
	found := false
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	for _, s := range servers {
		v := n.peers.views[string(s.ID)]
		if s.Suffrage != raft.Voter || string(s.ID) == n.cfg.ID || v == nil || v.failed ||
			time.Since(v.lastOK) > probeStale || v.status.Stopping {
			continue
		}
		if d := cluster - v.offsetMs; d < -max || d > max { // its clock minus the cluster's
			continue
		}
		if !found || v.status.AppliedIndex > bestApplied {
			best, bestApplied, found = s, v.status.AppliedIndex, true
		}
	}
	return best.ID, best.Address, found
}
