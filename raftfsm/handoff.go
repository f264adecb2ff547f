package raftfsm

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/replica"
)

// Graceful stop of a leader: stop proposing, let the proposals in flight
// finish, hand leadership to the best-placed follower, and wait until the
// cluster knows the new leader. Requests that reach this node meanwhile
// wait (api's onLeader sees HandingOff) and are then forwarded to the new
// leader instead of being refused.

// HandingOff reports whether this node is handing leadership off.
func (n *Node) HandingOff() bool { return n.handoff.Load() }

// enter admits a proposal unless a hand-off has begun (ErrNotLeader:
// nothing was proposed, the caller may go to the new leader); leave ends it.
func (n *Node) enter() error {
	n.inflight.Add(1)
	if n.handoff.Load() {
		n.inflight.Add(-1)
		return replica.ErrNotLeader
	}
	return nil
}

func (n *Node) leave() { n.inflight.Add(-1) }

// HandOff hands leadership to another voter, if this node leads a cluster
// of more than one; it returns once another node leads, or when ctx ends.
// From then on this node proposes nothing.
func (n *Node) HandOff(ctx context.Context) {
	if !n.IsLeader() {
		return
	}
	servers, err := n.Servers()
	if err != nil || len(servers) < 2 {
		return
	}
	start := time.Now()
	n.handoff.Store(true)
	for n.inflight.Load() > 0 {
		if pauseCtx(ctx, 2*time.Millisecond) != nil {
			break
		}
	}
	drained := time.Since(start)
	if err := n.transferLeadership(); err != nil {
		n.logger.Warn("leadership transfer", "err", err)
		return
	}
	for {
		if id, _, ok := n.Leader(); ok && id != n.cfg.ID {
			n.logger.Info("handed leadership off", "to", id, "drained", drained, "took", time.Since(start))
			return
		}
		if pauseCtx(ctx, 5*time.Millisecond) != nil {
			n.logger.Warn("no new leader after the hand-off", "waited", time.Since(start))
			return
		}
	}
}

func pauseCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// transferLeadership hands leadership to the best target: a voter this
// node can reach, that is not stopping, whose clock is within
// --max-clock-offset of the cluster's, and that has applied the most;
// raft's own choice (the most up to date follower) when there is none.
// Raft's choice alone could pick a node that hands it straight back (a
// stopping node, a node whose clock is off), and the two would bounce it.
func (n *Node) transferLeadership() error {
	id, addr, ok := n.transferTarget()
	var f raft.Future
	if ok {
		f = n.Raft.LeadershipTransferToServer(id, addr)
	} else {
		f = n.Raft.LeadershipTransfer()
	}
	return f.Error()
}

func (n *Node) transferTarget() (raft.ServerID, raft.ServerAddress, bool) {
	servers, err := n.Servers()
	if err != nil {
		return "", "", false
	}
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
