// Package housekeep is the leader's housekeeping of one replicated group:
// lease expiry sweeps, retention trims, dedup expiry and the pacing of
// dead-letter replays. It is soft state, rebuilt each time the node leads
// (Start), written against a small Group interface (read the applied
// state, propose a command): it only proposes commands, and the commands
// change state.
package housekeep

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Group is what the housekeeping needs of the replicated group it keeps:
// a read transaction on the applied state, and a proposal that waits for
// its command's result.
type Group interface {
	View(fn func(tx *bolt.Tx) error) error
	Propose(ctx context.Context, c *command.Command) (*fsm.Result, error)
}

const (
	sweepBatch = 512
	// dedupBatch bounds one dedup-expiry command, so that expiry never
	// stops the world: a large backlog of due keys goes in many commands.
	dedupBatch  = 2048
	dedupRounds = 16
)

// Keeper runs the housekeeping of one group while this node leads it. Its
// methods are called from the leader's loop, one at a time.
type Keeper struct {
	group   Group
	nodeID  string           // stamped into expiries, for the history
	now     func() time.Time // the clock stamped into commands
	logger  *slog.Logger
	replays *workSet[fsm.TopicGroup] // groups with a replay queued
	trims   *workSet[string]         // topics that may need trimming
	pacers  map[string]*replayPacer
}

// New returns the housekeeping of g, proposing as nodeID with the time now.
func New(g Group, nodeID string, now func() time.Time, logger *slog.Logger) *Keeper {
	return &Keeper{group: g, nodeID: nodeID, now: now, logger: logger,
		replays: &workSet[fsm.TopicGroup]{}, trims: &workSet[string]{}}
}

// ReplayQueued is the FSM hook (fsm.Hooks) that feeds the groups whose
// replay queue a batch changed.
func (k *Keeper) ReplayQueued(tgs []fsm.TopicGroup) { k.replays.add(tgs) }

// TopicsTouched is the FSM hook (fsm.Hooks) that feeds the topics a batch
// named.
func (k *Keeper) TopicsTouched(topics []string) { k.trims.add(topics) }

// Start rebuilds the soft state from the group's state, when this node
// has become leader and applied the log before its term.
func (k *Keeper) Start() {
	if err := k.replays.start(func() ([]fsm.TopicGroup, error) { return queuedReplays(k.group) }); err != nil {
		k.logger.Error("rebuild the set of queued replays", "err", err)
	}
	if err := k.trims.start(func() ([]string, error) { return allTopics(k.group) }); err != nil {
		k.logger.Error("list topics to check for trimming", "err", err)
	}
	k.pacers = map[string]*replayPacer{}
}

// Stop drops the soft state when leadership ends.
func (k *Keeper) Stop() {
	k.replays.stop()
	k.trims.stop()
	k.pacers = nil
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

// SweepLeases proposes the expiry of every lease past its deadline.
func (k *Keeper) SweepLeases(ctx context.Context) {
	for ctx.Err() == nil {
		now := k.now().UnixMilli()
		var due []group.Expired
		err := k.group.View(func(tx *bolt.Tx) error {
			var err error
			due, err = group.DueLeases(tx, now, sweepBatch)
			return err
		})
		if err != nil {
			k.logger.Error("lease sweep", "err", err)
			return
		}
		if len(due) == 0 {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = k.group.Propose(actx, &command.Command{Op: command.OpExpire, Now: now, Expired: due, NodeID: k.nodeID, Rands: draw(len(due))})
		cancel()
		if err != nil {
			k.logger.Warn("propose lease expiry", "err", err)
			return
		}
		if len(due) < sweepBatch {
			return
		}
	}
}

// EnforceRetention proposes a trim for each topic that retention would trim.
func (k *Keeper) EnforceRetention(ctx context.Context) {
	now := k.now().UnixMilli()
	var topics []string
	cands := k.trims.list()
	if len(cands) == 0 {
		return
	}
	err := k.group.View(func(tx *bolt.Tx) error {
		for _, t := range cands {
			l, err := mlog.Open(tx, t)
			if err != nil { // deleted
				k.trims.remove(t)
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
				k.trims.remove(t)
			}
		}
		return nil
	})
	if err != nil {
		k.logger.Error("retention plan", "err", err)
		return
	}
	for _, t := range topics {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := k.group.Propose(actx, &command.Command{Op: command.OpTrim, Now: now, Topic: t})
		cancel()
		if err != nil {
			k.logger.Warn("propose trim", "topic", t, "err", err)
			return
		}
	}
}

// ExpireDedup proposes the removal of dedup entries whose window passed,
// oldest first, a bounded batch per command.
func (k *Keeper) ExpireDedup(ctx context.Context) {
	for range dedupRounds {
		now := k.now().UnixMilli()
		due := false
		_ = k.group.View(func(tx *bolt.Tx) error {
			due = dedup.HasDue(tx, now)
			return nil
		})
		if !due || ctx.Err() != nil {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := k.group.Propose(actx, &command.Command{Op: command.OpDedupExpire, Now: now, Max: dedupBatch})
		cancel()
		if err != nil {
			k.logger.Warn("propose dedup expiry", "err", err)
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

// PaceReplays moves queued dead letters back into delivery at each
// replay's rate: the queue is replicated state, the pacing is the leader's
// (a new leader picks the replay up where the log says it is).
func (k *Keeper) PaceReplays(ctx context.Context) {
	pacers := k.pacers
	type job struct {
		topic, group string
		rate         uint64
	}
	var jobs []job
	cands := k.replays.list()
	if len(cands) == 0 {
		clear(pacers)
		return
	}
	_ = k.group.View(func(tx *bolt.Tx) error {
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
				k.replays.remove(tg)
				continue
			}
			jobs = append(jobs, job{tg.Topic, tg.Group, rate})
		}
		return nil
	})
	now := k.now()
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
		_, err := k.group.Propose(actx, &command.Command{Op: command.OpReplayStep, Now: now.UnixMilli(), Topic: j.topic, Group: j.group, Max: uint32(step)})
		cancel()
		if err != nil {
			k.logger.Warn("propose replay step", "topic", j.topic, "group", j.group, "err", err)
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
