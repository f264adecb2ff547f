package replica

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	bolt "go.etcd.io/bbolt"
)

// Leader-only machinery: soft state derived from the FSM, started when this
// replica gains leadership and stopped when it loses it. It only proposes
// commands; the commands change state.

const (
	// sweepEvery is the safety net under the timing wheel, which triggers
	// a sweep as soon as a lease is due.
	sweepEvery     = time.Second
	retentionEvery = time.Second
	replayEvery    = 100 * time.Millisecond
	// checkEvery: how often a leader asks Hooks.Unfit (the node checks its
	// clock against the cluster's, which the probes measure every 500 ms)
	// and runs what Hooks.Lead returned (raising the state format).
	checkEvery = time.Second
)

// Run runs the group until ctx ends: the group commit, the snapshot loop,
// raft's observations, the lost-log guard, and the leader loop while this
// replica leads.
func (g *Group) Run(ctx context.Context) {
	// stop ends the current term's leader loop and waits until it (and
	// everything it started) has exited: one leader loop at a time, so two
	// terms never run the scheduler or the sweeps side by side.
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	go g.batch.Run(ctx)
	go g.snapshotLoop(ctx)
	go g.watch(ctx)
	go g.lostLoop(ctx)
	ch := g.raft.LeaderCh()
	for {
		select {
		case <-ctx.Done():
			return
		case lead := <-ch:
			if stop != nil {
				stop()
				stop = nil
			}
			if lead {
				lctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() {
					defer close(done)
					g.leaderLoop(lctx)
				}()
				stop = func() { cancel(); <-done }
			}
		}
	}
}

// startServing runs from election to serving: the hand-off of a stopping
// node, the term's barrier, the lost-log guard and the node's gate. It
// answers whether to serve.
func (g *Group) startServing(ctx context.Context) bool {
	if g.HandingOff() { // stopping: do not take leadership back
		if err := g.TransferLeadership(); err != nil {
			g.logger.Warn("leadership transfer", "err", err)
		}
		return false
	}
	// Serve only once everything committed before this term is applied:
	// until then the FSM may not even know a topic that exists.
	for {
		err := g.raft.Barrier(10 * time.Second).Error()
		if err == nil {
			break
		}
		g.logger.Warn("leader barrier", "err", err)
		if ctx.Err() != nil || !g.IsLeader() {
			return false
		}
	}
	// A node that lost log entries it applied serves nothing (lostlog.go).
	if !g.leadGate(ctx) {
		return false
	}
	// A leader whose clock is off would stamp it into every command:
	// the node hands off instead. Nothing timestamped is proposed before.
	return g.cfg.Hooks.Gate == nil || g.cfg.Hooks.Gate(ctx, g, true)
}

func (g *Group) leaderLoop(ctx context.Context) {
	g.logger.Info("became leader", "id", g.cfg.NodeID)
	if !g.startServing(ctx) {
		return
	}
	g.serving.Store(true)
	defer g.serving.Store(false)
	var every func(context.Context)
	if g.cfg.Hooks.Lead != nil {
		every = g.cfg.Hooks.Lead(ctx, g)
	}
	schedDone := make(chan struct{})
	go func() {
		defer close(schedDone)
		g.sched.run(ctx)
	}()
	defer func() { <-schedDone }() // only ctx ends the loop below, and sched.run with it
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	ret := time.NewTicker(retentionEvery)
	defer ret.Stop()
	g.keep.Start()
	defer g.keep.Stop()
	replay := time.NewTicker(replayEvery)
	defer replay.Stop()
	check := time.NewTicker(checkEvery)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			if g.cfg.Hooks.Unfit != nil && g.cfg.Hooks.Unfit() {
				g.serving.Store(false) // requests wait for the next leader
				if g.cfg.Hooks.Gate != nil && !g.cfg.Hooks.Gate(ctx, g, false) {
					return
				}
				g.serving.Store(true)
			}
			if every != nil {
				every(ctx)
			}
		case <-sweep.C:
			g.keep.SweepLeases(ctx)
		case <-g.sched.kick:
			g.keep.SweepLeases(ctx)
		case <-ret.C:
			g.keep.EnforceRetention(ctx)
			g.keep.ExpireDedup(ctx)
		case <-replay.C:
			g.keep.PaceReplays(ctx)
		}
	}
}

// keeperGroup is the group as the leader's housekeeping sees it
// (housekeep.Group): reads of the applied state, and proposals.
type keeperGroup struct{ g *Group }

func (k keeperGroup) View(fn func(tx *bolt.Tx) error) error { return k.g.fsm.View(fn) }

func (k keeperGroup) Propose(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return k.g.Apply(ctx, c)
}

// peerSet holds the ids of the peers this leader's heartbeats fail to
// reach.
type peerSet struct{ m sync.Map }

// PeerDown reports whether this replica, leading, fails to reach peer id
// with its heartbeats (raft's observation, not a probe).
func (g *Group) PeerDown(id string) bool {
	_, down := g.peerDown.m.Load(id)
	return down
}

// watch follows raft's observations until ctx ends: it counts leader
// changes and says once when a peer stops answering the leader's
// heartbeats and once when it answers again (raft's own per-attempt lines
// are debug, see hclogAdapter).
func (g *Group) watch(ctx context.Context) {
	var leader raft.ServerID
	down := map[raft.ServerID]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-g.observed:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				if d.LeaderID != leader {
					leader = d.LeaderID
					g.metrics.leaderChanges.Inc()
				}
				if d.LeaderID != raft.ServerID(g.cfg.NodeID) {
					clear(down) // only a leader watches its peers
					g.peerDown.m.Clear()
				}
			case raft.FailedHeartbeatObservation:
				if _, ok := down[d.PeerID]; !ok {
					down[d.PeerID] = time.Now()
					g.peerDown.m.Store(string(d.PeerID), true)
					g.logger.Warn("raft peer unreachable", "peer", string(d.PeerID),
						"last_contact", d.LastContact.UTC().Format(time.RFC3339Nano))
				}
			case raft.ResumedHeartbeatObservation:
				if since, ok := down[d.PeerID]; ok {
					delete(down, d.PeerID)
					g.peerDown.m.Delete(string(d.PeerID))
					g.logger.Info("raft peer reachable again", "peer", string(d.PeerID),
						"down_for", time.Since(since).Round(time.Millisecond).String())
				}
			}
		}
	}
}
