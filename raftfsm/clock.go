package raftfsm

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// TestClockOffsetEnv shifts a node's wall clock, for tests of clock skew
// only: MQD_TEST_CLOCK_OFFSET=8h (any time.ParseDuration value, or with a
// "d" suffix for days) makes every wall-clock reading of the node that much
// later. Never set it in production.
const TestClockOffsetEnv = "MQD_TEST_CLOCK_OFFSET"

// clock is the node's wall clock and what it knows of the others'.
type clock struct {
	shift time.Duration // test-only, from TestClockOffsetEnv

	mu      sync.Mutex
	offsets map[string]int64 // member id → this node's clock minus the member's, ms
}

func newClock() (*clock, error) {
	c := &clock{offsets: map[string]int64{}}
	if v := os.Getenv(TestClockOffsetEnv); v != "" {
		d, err := parseDays(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", TestClockOffsetEnv, err)
		}
		c.shift = d
	}
	return c, nil
}

// parseDays is time.ParseDuration that also takes whole days ("8d", "-2d").
func parseDays(v string) (time.Duration, error) {
	var days int
	if _, err := fmt.Sscanf(v, "%dd", &days); err == nil && fmt.Sprintf("%dd", days) == v {
		return time.Duration(days) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// now is the node's wall clock.
func (c *clock) now() time.Time { return time.Now().Add(c.shift) }

// at is the node's wall clock reading for a time taken with time.Now.
func (c *clock) at(t time.Time) time.Time { return t.Add(c.shift) }

// observe records a measured offset to member id.
func (c *clock) observe(id string, offsetMs int64) {
	c.mu.Lock()
	c.offsets[id] = offsetMs
	c.mu.Unlock()
}

// Now is the node's wall clock: what it stamps into commands.
func (n *Node) Now() time.Time { return n.clock.now() }
