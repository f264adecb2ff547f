package housekeep

import (
	"sync"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// workSet is a leader's set of things (groups with a replay queued,
// topics that may need trimming) that its periodic loops visit instead of
// every group of every topic: with 10,000 topics and 40,000 groups those
// walks cost an idle leader 70 % of a core. Soft state: filled from the
// FSM when this node becomes leader, fed by every applied batch while it
// leads; a loop removes what it finds needs nothing.
type workSet[K comparable] struct {
	mu     sync.Mutex
	active bool
	set    map[K]struct{}
}

// add records keys an applied batch changed.
func (p *workSet[K]) add(keys []K) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active {
		return
	}
	for _, k := range keys {
		p.set[k] = struct{}{}
	}
}

// start fills the set with what fill finds in the FSM. It goes active
// before fill reads, so a batch applied meanwhile is not missed.
func (p *workSet[K]) start(fill func() ([]K, error)) error {
	p.mu.Lock()
	p.active, p.set = true, map[K]struct{}{}
	p.mu.Unlock()
	found, err := fill()
	p.add(found)
	return err
}

func (p *workSet[K]) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active, p.set = false, nil
}

func (p *workSet[K]) list() []K {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]K, 0, len(p.set))
	for k := range p.set {
		out = append(out, k)
	}
	return out
}

func (p *workSet[K]) remove(k K) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.set, k)
}

// queuedReplays lists the groups with dead letters queued for replay.
func queuedReplays(f Group) ([]fsm.TopicGroup, error) {
	var found []fsm.TopicGroup
	err := f.View(func(tx *bolt.Tx) error {
		for _, t := range mlog.Topics(tx) {
			l, err := mlog.Open(tx, t)
			if err != nil {
				return err
			}
			for _, gname := range group.Names(l) {
				g, err := group.Open(tx, l, gname, false, 0)
				if err != nil {
					return err
				}
				if store, err := g.DeadLetters(); err == nil && store.ReplayRate() > 0 {
					found = append(found, fsm.TopicGroup{Topic: t, Group: gname})
				}
			}
		}
		return nil
	})
	return found, err
}

// allTopics lists every topic: a new leader checks each once for trimming.
func allTopics(f Group) ([]string, error) {
	var out []string
	err := f.View(func(tx *bolt.Tx) error {
		out = mlog.Topics(tx)
		return nil
	})
	return out, err
}
