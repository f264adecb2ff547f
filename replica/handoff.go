package replica

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
)

// Graceful stop of a leader: stop proposing, let the proposals in flight
// finish, hand leadership to the best-placed follower, and wait until the
// group knows the new leader. Requests that reach this node meanwhile
// wait (api's onLeader sees HandingOff) and are then forwarded to the new
// leader instead of being refused.

// HandingOff reports whether this replica is handing leadership off.
func (g *Group) HandingOff() bool { return g.handoff.Load() }

// enter admits a proposal unless a hand-off has begun (ErrNotLeader:
// nothing was proposed, the caller may go to the new leader); leave ends it.
func (g *Group) enter() error {
	g.inflight.Add(1)
	if g.handoff.Load() {
		g.inflight.Add(-1)
		return ErrNotLeader
	}
	return nil
}

func (g *Group) leave() { g.inflight.Add(-1) }

// HandOff hands leadership to another voter, if this replica leads a group
// of more than one; it returns once known reports that another node leads
// (nil: raft knows another leader), or when ctx ends. From then on this
// replica proposes nothing.
func (g *Group) HandOff(ctx context.Context, known func() (id string, ok bool)) {
	if !g.IsLeader() {
		return
	}
	servers, err := g.Servers()
	if err != nil || len(servers) < 2 {
		return
	}
	if known == nil {
		known = g.LeaderID
	}
	start := time.Now()
	g.handoff.Store(true)
	for g.inflight.Load() > 0 {
		if Pause(ctx, 2*time.Millisecond) != nil {
			break
		}
	}
	drained := time.Since(start)
	if err := g.TransferLeadership(); err != nil {
		g.logger.Warn("leadership transfer", "err", err)
		return
	}
	for {
		if id, ok := known(); ok && id != g.cfg.NodeID {
			g.logger.Info("handed leadership off", "to", id, "drained", drained, "took", time.Since(start))
			return
		}
		if Pause(ctx, 5*time.Millisecond) != nil {
			g.logger.Warn("no new leader after the hand-off", "waited", time.Since(start))
			return
		}
	}
}

// Pause waits d, or until ctx ends (its error).
func Pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// TransferLeadership hands leadership to the target Hooks.TransferTarget
// picks, or to raft's own choice (the most up to date follower) when it
// picks none. Raft's choice alone could pick a node that hands it straight
// back (a stopping node, a node whose clock is off), and the two would
// bounce it.
func (g *Group) TransferLeadership() error {
	var id raft.ServerID
	var addr raft.ServerAddress
	ok := false
	if h := g.cfg.Hooks.TransferTarget; h != nil {
		if servers, err := g.Servers(); err == nil {
			id, addr, ok = h(servers)
		}
	}
	var f raft.Future
	if ok {
		f = g.raft.LeadershipTransferToServer(id, addr)
	} else {
		f = g.raft.LeadershipTransfer()
	}
	return f.Error()
}
