package raftfsm

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/replica"
	"github.com/prometheus/client_golang/prometheus"
)

// Clock skew. The leader stamps its service clock (timeline.go: its wall
// clock as followed by the monotonic clock) into every command, so a
// leader whose clock is far off would expire dedup keys and leases early
// (ahead) or late (behind). The defences:
//   - the FSM never lets time go backwards (fsm/fsm.go, clampNow);
//   - the service clock follows a wall clock stepped while running at 1 %
//     only (timeline.go);
//   - every node measures its wall clock against the others' on the status
//     probes (peers.go), and a node whose clock is off from a majority of the
//     voters by more than --max-clock-offset does not lead: it hands
//     leadership off, and it answers /readyz 503 with the reason;
//   - a single-node cluster, with nobody to compare with, checks its wall
//     clock against the one it recorded when it last ran (timeline.go).

// TestClockOffsetEnv shifts the process's wall clock, for tests of clock
// skew only: MQD_TEST_CLOCK_OFFSET=8d (a time.ParseDuration value, or
// whole days with a "d" suffix) makes every wall-clock reading of the node
// that much later. Never set it in production.
const TestClockOffsetEnv = "MQD_TEST_CLOCK_OFFSET"

// DefaultMaxClockOffset is --max-clock-offset's default.
const DefaultMaxClockOffset = 500 * time.Millisecond

var (
	shiftOnce sync.Once
	shift     time.Duration
	shiftErr  error
)

func wallShift() (time.Duration, error) {
	shiftOnce.Do(func() {
		if v := os.Getenv(TestClockOffsetEnv); v != "" {
			shift, shiftErr = parseDays(v)
			if shiftErr != nil {
				shiftErr = fmt.Errorf("%s: %w", TestClockOffsetEnv, shiftErr)
			}
		}
	})
	return shift, shiftErr
}

// ServiceClock is Now (timeline.go) as a delay.Clock.
type ServiceClock struct{}

// Now returns Now().
func (ServiceClock) Now() time.Time { return Now() }

// parseDays is time.ParseDuration that also takes whole days ("8d", "-2d").
func parseDays(v string) (time.Duration, error) {
	var days int
	if _, err := fmt.Sscanf(v, "%dd", &days); err == nil && fmt.Sprintf("%dd", days) == v {
		return time.Duration(days) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// clockOffsetFresh is how old a measured offset may be to count. Offsets
// change slowly (NTP slews at most 0.5 ms a second: 15 ms in 30 s), so a
// member that stopped answering a moment ago still vouches for this node's
// clock: a leader does not step down for its clock the instant one
// follower pauses while another is skewed. A sudden jump of a clock that
// answers shows on its next probe, 500 ms later.
const clockOffsetFresh = 30 * time.Second

// clock is what this node knows of the others' clocks.
type clock struct {
	mu      sync.Mutex
	offsets map[string]measured // member id → this node's clock minus the member's
}

type measured struct {
	ms int64
	at time.Time
}

func newClock() (*clock, error) {
	if _, err := wallShift(); err != nil {
		return nil, err
	}
	return &clock{offsets: map[string]measured{}}, nil
}

// observe records a measured offset to member id.
func (c *clock) observe(id string, offsetMs int64) {
	c.mu.Lock()
	c.offsets[id] = measured{ms: offsetMs, at: time.Now()}
	c.mu.Unlock()
}

// ClockState is this node's clock against the cluster's.
type ClockState struct {
	// Offset is this node's clock minus the cluster's: the median of the
	// fresh offsets to the voters, this node's own (0) included.
	Offset time.Duration
	// Known: offsets to enough voters were measured to judge.
	Known bool
	// Bad: this node is further than --max-clock-offset from a majority
	// of the voters (itself included); Reason says how.
	Bad    bool
	Reason string
	// Solo: the node is the only voter; Bad then means its clock jumped
	// ahead while it was down (timeline.go).
	Solo bool
}

// Clock judges this node's clock: it is bad when fewer than a majority of
// the voters (itself included) are within --max-clock-offset of it while
// enough offsets were measured to know; with too few measurements (a
// single node, peers down) it is not judged bad.
func (n *Node) Clock() ClockState {
	servers, err := n.Servers()
	if err != nil {
		return ClockState{}
	}
	voters := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	quorum := voters/2 + 1
	max := n.cfg.MaxClockOffset.Milliseconds()
	n.clock.mu.Lock()
	offs := []int64{0}
	within, measuredN := 1, 0
	for _, s := range servers {
		m, ok := n.clock.offsets[string(s.ID)]
		if s.Suffrage != raft.Voter || string(s.ID) == n.cfg.ID || !ok || time.Since(m.at) > clockOffsetFresh {
			continue
		}
		measuredN++
		offs = append(offs, m.ms)
		if m.ms >= -max && m.ms <= max {
			within++
		}
	}
	n.clock.mu.Unlock()
	slices.Sort(offs)
	st := ClockState{Offset: time.Duration(offs[len(offs)/2]) * time.Millisecond}
	st.Known = voters <= 1 || measuredN+1 >= quorum
	if voters <= 1 {
		st.Reason, st.Bad = n.soloClockBad()
		st.Solo = true
		return st
	}
	if within < quorum && st.Known {
		st.Bad = true
		st.Reason = fmt.Sprintf("clock is %v off from the cluster's (median of %d voters), further than --max-clock-offset %v from a majority",
			st.Offset, len(offs), n.cfg.MaxClockOffset)
	}
	return st
}

// clockGate runs before g's new leader serves: it waits (up to 3 s) for
// enough clock measurements, and while this node's clock is bad it hands
// leadership off instead of serving. It answers whether to serve.
func (n *Node) clockGate(ctx context.Context, g *replica.Group) bool {
	deadline := time.Now().Add(3 * time.Second)
	for {
		st := n.Clock()
		switch {
		case st.Bad && st.Solo: // nobody to hand off to: wait to be told
			if !n.clockStart.reported.Swap(true) {
				n.logger.Error("not leading: " + st.Reason)
			}
		case st.Bad:
			n.handOffForClock(g, st)
			if !g.IsLeader() {
				return false
			}
		case st.Known:
			return true
		case time.Now().After(deadline):
			n.logger.Warn("leading without knowing the other nodes' clocks (no measurement yet)")
			return true
		}
		if replica.Pause(ctx, 100*time.Millisecond) != nil || !g.IsLeader() {
			return false
		}
	}
}

func (n *Node) handOffForClock(g *replica.Group, st ClockState) {
	l := n.logger
	if g.ID() != replica.DefaultGroup {
		l = l.With(replica.GroupLabel, g.ID())
	}
	l.Error("not leading: "+st.Reason+"; handing leadership off", "offset", st.Offset)
	if err := g.TransferLeadership(); err != nil {
		n.logger.Warn("leadership transfer", "err", err)
	}
}

func (n *Node) clockCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_clock_offset_seconds",
			Help: "This node's wall clock minus the cluster's (median of the offsets measured to the voters, this node's 0 included)."},
			func() float64 { return n.Clock().Offset.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_clock_offset_bad",
			Help: "1 while this node's clock is further than --max-clock-offset from a majority of the voters, or, the only voter, ahead of the clock it recorded plus the time it was down (it does not lead, /readyz is 503)."},
			func() float64 {
				if n.Clock().Bad {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_clock_service_lag_seconds",
			Help: "This node's wall clock minus its service clock, which the leader stamps into commands and which slews toward the wall clock at 1 %."},
			func() float64 { return Wall().Sub(Now()).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_clock_max_offset_seconds", Help: "--max-clock-offset."},
			func() float64 { return n.cfg.MaxClockOffset.Seconds() }),
	}
}
