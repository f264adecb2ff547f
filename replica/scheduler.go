package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqd/mqd/delay"
	"github.com/mqd/mqd/group"
	bolt "go.etcd.io/bbolt"
)

// scheduler is the leader's timing wheel over the FSM's due times: lease
// expiries (when one is due the leader proposes OpExpire) and waiting
// messages (retries, delayed publishes, replays: when one is due, the
// long-polling fetches of its topic are woken). It is soft state: the due
// times live in the replicated state; the wheel is rebuilt from it each time
// this node becomes leader and fed by every applied batch while it leads.
type scheduler struct {
	g      *Group
	wheel  *delay.Wheel[wakeup]
	active atomic.Bool
	kick   chan struct{} // a lease expiry is due: sweep

	mu     sync.Mutex
	intern map[string]string // topic names, so 1 M timers share a few strings
}

type wakeup struct {
	topic string
	lease bool
}

func newScheduler(g *Group) *scheduler {
	w, err := delay.New[wakeup](delay.Config{Tick: 10 * time.Millisecond, Clock: clockFunc(g.cfg.Now)})
	if err != nil {
		panic(err) // the config is a constant
	}
	s := &scheduler{g: g, wheel: w, kick: make(chan struct{}, 1), intern: map[string]string{}}
	g.fsm.Schedule = s.add
	return s
}

// add schedules timers created by an applied batch, while leading.
func (s *scheduler) add(ts []group.Timer) {
	if !s.active.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range ts {
		s.wheel.Add(time.UnixMilli(t.At), wakeup{topic: s.name(t.Topic), lease: t.Lease})
	}
}

func (s *scheduler) name(t string) string {
	if v, ok := s.intern[t]; ok {
		return v
	}
	if len(s.intern) > 100000 {
		clear(s.intern)
	}
	s.intern[t] = t
	return t
}

// run rebuilds the wheel from the FSM and fires it until ctx ends (the end
// of this node's leadership).
func (s *scheduler) run(ctx context.Context) {
	s.wheel.Reset()
	s.active.Store(true) // before the rebuild: a batch applied meanwhile is not missed
	defer s.active.Store(false)
	now := s.g.cfg.Now().UnixMilli()
	var batch []group.Timer
	err := s.g.fsm.View(func(tx *bolt.Tx) error {
		return group.ForEachTimer(tx, now, func(t group.Timer) {
			batch = append(batch, t)
			if len(batch) == 4096 {
				s.add(batch)
				batch = batch[:0]
			}
		})
	})
	s.add(batch)
	if err != nil {
		s.g.logger.Error("rebuild timing wheel", "err", err)
	}
	s.g.logger.Info("timing wheel rebuilt", "timers", s.wheel.Len())
	s.wheel.Run(ctx, s.fire)
}

func (s *scheduler) fire(due []wakeup) {
	topics := map[string]struct{}{}
	lease := false
	for _, w := range due {
		if w.lease {
			lease = true
		} else {
			topics[w.topic] = struct{}{}
		}
	}
	if lease {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if len(topics) > 0 {
		s.g.fsm.Wake(topics)
	}
}

// clockFunc is a clock function as a delay.Clock.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }
