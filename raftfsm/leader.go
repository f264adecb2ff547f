package raftfsm

import (
	"context"
	"time"

	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Leader-only machinery: soft state derived from the FSM, started when this
// node gains leadership and stopped when it loses it. It only proposes
// commands; the commands change state.

const (
	sweepEvery     = 50 * time.Millisecond
	retentionEvery = time.Second
	sweepBatch     = 512
	// dedupBatch bounds one dedup-expiry command, so that expiry never
	// stops the world: a large backlog of due keys goes in many commands.
	dedupBatch  = 2048
	dedupRounds = 16
)

// Run watches leadership until ctx ends, running the leader loops while
// this node leads.
func (n *Node) Run(ctx context.Context) {
	var stop context.CancelFunc
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	go n.batch.run(ctx)
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
				stop = cancel
				go n.leaderLoop(lctx)
			}
		}
	}
}

func (n *Node) leaderLoop(ctx context.Context) {
	n.logger.Info("became leader", "id", n.cfg.ID)
	if err := n.Raft.Barrier(10 * time.Second).Error(); err != nil {
		n.logger.Warn("leader barrier", "err", err)
	}
	if err := n.Join(ctx, n.Info()); err != nil {
		n.logger.Warn("record own address", "err", err)
	}
	sweep := time.NewTicker(sweepEvery)
	defer sweep.Stop()
	ret := time.NewTicker(retentionEvery)
	defer ret.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			n.sweepLeases(ctx)
		case <-ret.C:
			n.enforceRetention(ctx)
			n.expireDedup(ctx)
		}
	}
}

// sweepLeases proposes the expiry of every lease past its deadline.
func (n *Node) sweepLeases(ctx context.Context) {
	for ctx.Err() == nil {
		now := time.Now().UnixMilli()
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
		_, err = n.Apply(actx, &Command{Op: OpExpire, Now: now, Expired: due})
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
	now := time.Now().UnixMilli()
	var topics []string
	err := n.FSM.View(func(tx *bolt.Tx) error {
		for _, t := range mlog.Topics(tx) {
			l, err := mlog.Open(tx, t)
			if err != nil {
				return err
			}
			plan, err := TrimPlan(tx, l, now)
			if err != nil {
				return err
			}
			if len(plan) > 0 {
				topics = append(topics, t)
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
		_, err := n.Apply(actx, &Command{Op: OpTrim, Now: now, Topic: t})
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
		now := time.Now().UnixMilli()
		due := false
		_ = n.FSM.View(func(tx *bolt.Tx) error {
			due = dedup.HasDue(tx, now)
			return nil
		})
		if !due || ctx.Err() != nil {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.Apply(actx, &Command{Op: OpDedupExpire, Now: now, Max: dedupBatch})
		cancel()
		if err != nil {
			n.logger.Warn("propose dedup expiry", "err", err)
			return
		}
	}
}
