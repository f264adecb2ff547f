package raftfsm

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
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
	sweepBatch     = 512
	replayEvery    = 100 * time.Millisecond
	// dedupBatch bounds one dedup-expiry command, so that expiry never
	// stops the world: a large backlog of due keys goes in many commands.
	dedupBatch  = 2048
	dedupRounds = 16
	// clockCheckEvery: how often a leader checks its clock against the
	// cluster's (the probes measure every 500 ms), and whether it can
	// raise the state format (format.go).
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
	go n.batch.run(ctx)
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
	if err := n.replays.start(func() ([]fsm.TopicGroup, error) { return queuedReplays(n.FSM) }); err != nil {
		n.logger.Error("rebuild the set of queued replays", "err", err)
	}
	defer n.replays.stop()
	if err := n.trims.start(func() ([]string, error) { return allTopics(n.FSM) }); err != nil {
		n.logger.Error("list topics to check for trimming", "err", err)
	}
	defer n.trims.stop()
	replay := time.NewTicker(replayEvery)
	defer replay.Stop()
	pacer := map[string]*replayPacer{}
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
			n.sweepLeases(ctx)
		case <-n.sched.kick:
			n.sweepLeases(ctx)
		case <-ret.C:
			n.enforceRetention(ctx)
			n.expireDedup(ctx)
		case <-replay.C:
			n.paceReplays(ctx, pacer)
		}
	}
}

// holdsMessages reports whether any partition of l retains a message.
func holdsMessages(l *mlog.Log) bool {
	for p := uint32(0); p < l.Cfg.Partitions; p++ {
		if part, err := l.Partition(p); err != nil || part.Meta.First < part.Meta.Next {
			return true
		}
	}
	return false
}

// sweepLeases proposes the expiry of every lease past its deadline.
func (n *Node) sweepLeases(ctx context.Context) {
	for ctx.Err() == nil {
		now := Now().UnixMilli()
		var due []group.Expired
		err := n.FSM.View(func(tx *bolt.Tx) error {
			var err error
			due, err = group.DueLeases(tx, now, sweepBatch)
			return err
		})
		if err != nil {
			n.logger.Error("lease sweep", "err", err)
			return
		}
		if len(due) == 0 {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = n.Apply(actx, &command.Command{Op: command.OpExpire, Now: now, Expired: due, NodeID: n.cfg.ID, Rands: draw(len(due))})
		cancel()
		if err != nil {
			n.logger.Warn("propose lease expiry", "err", err)
			return
		}
		if len(due) < sweepBatch {
			return
		}
	}
}

// enforceRetention proposes a trim for each topic that retention would trim.
func (n *Node) enforceRetention(ctx context.Context) {
	now := Now().UnixMilli()
	var topics []string
	cands := n.trims.list()
	if len(cands) == 0 {
		return
	}
	err := n.FSM.View(func(tx *bolt.Tx) error {
		for _, t := range cands {
			l, err := mlog.Open(tx, t)
			if err != nil { // deleted
				n.trims.remove(t)
				continue
			}
			plan, err := fsm.TrimPlan(tx, l, now)
			if err != nil {
				return err
			}
			if len(plan) > 0 {
				topics = append(topics, t) // the trim touches it: checked again
			} else if l.Cfg.RetentionMs == 0 || !holdsMessages(l) {
				// Only time can make a trim due here, and only with
				// retention_ms: otherwise a command on the topic will.
				n.trims.remove(t)
			}
		}
		return nil
	})
	if err != nil {
		n.logger.Error("retention plan", "err", err)
		return
	}
	for _, t := range topics {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.Apply(actx, &command.Command{Op: command.OpTrim, Now: now, Topic: t})
		cancel()
		if err != nil {
			n.logger.Warn("propose trim", "topic", t, "err", err)
			return
		}
	}
}

// expireDedup proposes the removal of dedup entries whose window passed,
// oldest first, a bounded batch per command.
func (n *Node) expireDedup(ctx context.Context) {
	for range dedupRounds {
		now := Now().UnixMilli()
		due := false
		_ = n.FSM.View(func(tx *bolt.Tx) error {
			due = dedup.HasDue(tx, now)
			return nil
		})
		if !due || ctx.Err() != nil {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.Apply(actx, &command.Command{Op: command.OpDedupExpire, Now: now, Max: dedupBatch})
		cancel()
		if err != nil {
			n.logger.Warn("propose dedup expiry", "err", err)
			return
		}
	}
}

// draw returns n random numbers for jitter; the FSM scales them.
func draw(n int) []uint32 {
	rs := make([]uint32, n)
	for i := range rs {
		rs[i] = rand.Uint32()
	}
	return rs
}

// replayPacer is a token bucket for one group's dead-letter replay.
type replayPacer struct {
	last   time.Time
	tokens float64
}

// paceReplays moves queued dead letters back into delivery at each
// replay's rate: the queue is replicated state, the pacing is the leader's
// (a new leader picks the replay up where the log says it is).
func (n *Node) paceReplays(ctx context.Context, pacers map[string]*replayPacer) {
	type job struct {
		topic, group string
		rate         uint64
	}
	var jobs []job
	cands := n.replays.list()
	if len(cands) == 0 {
		clear(pacers)
		return
	}
	_ = n.FSM.View(func(tx *bolt.Tx) error {
		for _, tg := range cands {
			rate := uint64(0)
			if l, err := mlog.Open(tx, tg.Topic); err == nil {
				if g, err := group.Open(tx, l, tg.Group, false, 0); err == nil {
					if store, err := g.DeadLetters(); err == nil {
						rate = store.ReplayRate()
					}
				}
			}
			if rate == 0 { // queue empty, or the group or topic is gone
				n.replays.remove(tg)
				continue
			}
			jobs = append(jobs, job{tg.Topic, tg.Group, rate})
		}
		return nil
	})
	now := Now()
	active := map[string]bool{}
	for _, j := range jobs {
		key := j.topic + "\x00" + j.group
		active[key] = true
		p := pacers[key]
		if p == nil {
			p = &replayPacer{last: now}
			pacers[key] = p
		}
		p.tokens = min(p.tokens+now.Sub(p.last).Seconds()*float64(j.rate), max(float64(j.rate)/5, 1))
		p.last = now
		if p.tokens < 1 {
			continue
		}
		step := int(p.tokens)
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.Apply(actx, &command.Command{Op: command.OpReplayStep, Now: now.UnixMilli(), Topic: j.topic, Group: j.group, Max: uint32(step)})
		cancel()
		if err != nil {
			n.logger.Warn("propose replay step", "topic", j.topic, "group", j.group, "err", err)
			return
		}
		p.tokens -= float64(step)
	}
	for k := range pacers {
		if !active[k] {
			delete(pacers, k)
		}
	}
}
