package api

import (
	"sync"

	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
)

// cfgCache keeps topic configurations between changes, so that a publish
// does not open a bbolt read transaction just to learn its topic's
// partition count and size limit. Entries are valid for one FSM config
// generation; the FSM re-checks everything a stale entry could get wrong
// (size limit, partition range) when it applies the publish.
type cfgCache struct {
	mu  sync.RWMutex
	gen uint64
	m   map[string]mlog.Config
}

// topicConfig returns the topic's configuration, from the cache while no
// topic changed since it was read.
func (s *Server) topicConfig(topic string) (mlog.Config, error) {
	gen := s.state.ConfigGen() // before the read: a newer change invalidates it
	c := &s.cfgs
	c.mu.RLock()
	cfg, ok := c.m[topic]
	hit := ok && c.gen == gen
	c.mu.RUnlock()
	if hit {
		return cfg, nil
	}
	return s.readTopicConfig(topic, gen)
}

// readTopicConfig reads the topic's configuration and caches it for gen.
// (Apart from topicConfig, so that the hit path's cfg, which this read's
// closure captures, does not move to the heap on every publish.)
func (s *Server) readTopicConfig(topic string, gen uint64) (mlog.Config, error) {
	c := &s.cfgs
	var cfg mlog.Config
	err := s.state.Read(func(r *fsm.Reader) error {
		var err error
		cfg, err = r.TopicConfig(topic)
		return err
	})
	if err != nil {
		return cfg, err
	}
	c.mu.Lock()
	if c.gen != gen || c.m == nil {
		c.gen, c.m = gen, map[string]mlog.Config{}
	}
	c.m[topic] = cfg
	c.mu.Unlock()
	return cfg, nil
}
