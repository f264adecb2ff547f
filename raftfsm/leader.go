package raftfsm

import (
	"context"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	bolt "go.etcd.io/bbolt"
)

// Leader-only machinery: soft state derived from the FSM, started when this
// node gains leadership and stopped when it loses it. It only proposes
// commands; the commands change state.

const (
	// sweepEvery is the safety net under the timing wheel, which triggers
	// a sweep as soon as a lease is due.
	sweepEvery     = time.Second
	retentionEvery = time.Second
	replayEvery    = 100 * time.Millisecond
	// clockCheckEvery: how often a leader checks its clock against the
	// cluster's (the probes measure every 500 ms), and whether it can
	// raise the state format (formatraise.go).
	clockCheckEvery = time.Second
)

// Run watches leadership until ctx ends, running the leader loops while
// this node leads.
func (n *Node) Run(ctx context.Context) {
	// stop ends the current term's leader loop and waits until it (and
	// everything it started) has exited: one leader loop at a time, so two
	// terms never run the scheduler or the sweeps side by side.
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	go n.batch.Run(ctx)
	go n.snapshotLoop(ctx)
	go n.watch(ctx)
	go n.probeLoop(ctx)
	go n.recordClockLoop(ctx.Done())
	go n.lostLoop(ctx)
	ch := n.Raft.LeaderCh()
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
					n.leaderLoop(lctx)
				}()
				stop = func() { cancel(); <-done }
			}
		}
	}
}

func (n *Node) leaderLoop(ctx context.Context) {
	n.logger.Info("became leader", "id", n.cfg.ID)
	if n.HandingOff() { // stopping: do not take leadership back
		if err := n.transferLeadership(); err != nil {
			n.logger.Warn("leadership transfer", "err", err)
		}
		return
	}
	// Serve only once everything committed before this term is applied:
	// until then the FSM may not even know a topic that exists.
	for {
		err := n.Raft.Barrier(10 * time.Second).Error()
		if err == nil {
			break
		}
		n.logger.Warn("leader barrier", "err", err)
		if ctx.Err() != nil || !n.IsLeader() {
			return
		}
	}
	// A node that lost log entries it applied serves nothing (lostlog.go).
	if !n.leadGate(ctx) {
		return
	}
	// A leader whose clock is off would stamp it into every command:
	// hand off instead (clock.go). Nothing timestamped is proposed before.
	if !n.clockGate(ctx) {
		return
	}
	st := n.Clock()
	n.anchorServiceClock(!st.Solo && st.Known && !st.Bad)
	n.serving.Store(true)
	defer n.serving.Store(false)
	if err := n.Join(ctx, n.Info()); err != nil {
		n.logger.Warn("record own address", "err", err)
	}
	warned := map[string]bool{} // members named as unable to read the state format
	n.checkFormat(ctx, warned)  // a single node raises it at once; others once the probes answer
	schedDone := make(chan struct{})
	go func() {
		defer close(schedDone)
		n.sched.run(ctx)
	}()
	defer func() { <-schedDone }() // only ctx ends the loop below, and sched.run with it
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	ret := time.NewTicker(retentionEvery)
	defer ret.Stop()
	n.keep.Start()
	defer n.keep.Stop()
	replay := time.NewTicker(replayEvery)
	defer replay.Stop()
	clockCheck := time.NewTicker(clockCheckEvery)
	defer clockCheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-clockCheck.C:
			if n.Clock().Bad {
				n.serving.Store(false) // requests wait for the next leader
				if !n.clockGate(ctx) {
					return
				}
				n.serving.Store(true)
			}
			n.checkFormat(ctx, warned)
		case <-sweep.C:
			n.keep.SweepLeases(ctx)
		case <-n.sched.kick:
			n.keep.SweepLeases(ctx)
		case <-ret.C:
			n.keep.EnforceRetention(ctx)
			n.keep.ExpireDedup(ctx)
		case <-replay.C:
			n.keep.PaceReplays(ctx)
		}
	}
}

// leaderGroup is the replicated group as the leader's housekeeping sees
// it (housekeep.Group): reads of the applied state, and proposals.
type leaderGroup struct{ n *Node }

func (g leaderGroup) View(fn func(tx *bolt.Tx) error) error { return g.n.FSM.View(fn) }

func (g leaderGroup) Propose(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return g.n.Apply(ctx, c)
}
