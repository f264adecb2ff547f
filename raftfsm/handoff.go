package raftfsm

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
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
		return ErrNotLeader
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
	if err := n.Raft.LeadershipTransfer().Error(); err != nil {
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

// isTransferring is raft's refusal of a proposal during a leadership
// transfer: nothing was appended.
func isTransferring(err error) bool { return errors.Is(err, raft.ErrLeadershipTransferInProgress) }

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
