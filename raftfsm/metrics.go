package raftfsm

import (
	"context"
	"strings"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the node's Prometheus collectors: raft's own timings,
// snapshots and leadership; and what the FSM applied per topic and group
// (counted only for entries this node had not applied before it started),
// kept as plain sums that the HTTP layer's scrape writes out (GroupTallies)
// next to the state's per-group gauges.
type nodeMetrics struct {
	mu      sync.Mutex
	tallies map[fsm.TopicGroup]*TallyAt
	applied func() uint64 // the fsm.FSM's applied index

	leaderChanges prometheus.Counter
	snapshots     prometheus.Counter
	snapshotTime  prometheus.Histogram
	snapshotBytes prometheus.Gauge
	// snapshotWritten sums the sizes of the snapshots taken, to set
	// against mqd_raft_applied_bytes_total (the snapshot policy keeps it
	// within twice that).
	snapshotWritten prometheus.Counter
	// recoveries counts the decisions taken about damaged or untrusted
	// files (fsm/damage.go), by reason.
	recoveries *prometheus.CounterVec
}

func (m *nodeMetrics) recovery(reason string) { m.recoveries.WithLabelValues(reason).Inc() }

// TallyAt is a group's sums of applied events, with the applied index
// they were last added at.
type TallyAt struct {
	group.Tally
	At uint64
}

func newNodeMetrics() *nodeMetrics {
	return &nodeMetrics{
		tallies: map[fsm.TopicGroup]*TallyAt{},
		applied: func() uint64 { return 0 },
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_leader_changes_total",
			Help: "Times this node saw the cluster's leader change (including to none)."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_snapshots_total",
			Help: "Snapshots this node took."}),
		snapshotTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_snapshot_seconds",
			Help: "Time to take a snapshot (copy the state to the snapshot store).", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mqd_raft_snapshot_bytes",
			Help: "Size of this node's latest snapshot."}),
		snapshotWritten: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_snapshot_written_bytes_total",
			Help: "Bytes of snapshots this node took (the sum of their sizes)."}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_fsm_recoveries_total",
			Help: "Decisions taken at start about fsm.db and the snapshots: opened at the last checkpoint after an unclean stop (unclean_stop), or set aside and rebuilt, by what was found."},
			[]string{"reason"}),
	}
}

// tally adds a batch's events to the sums (called after the batch is
// applied, so the applied index covers it).
func (m *nodeMetrics) tally(ts map[fsm.TopicGroup]*group.Tally) {
	at := m.applied()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, t := range ts {
		s := m.tallies[k]
		if s == nil {
			s = &TallyAt{}
			m.tallies[k] = s
		}
		s.Nacked += t.Nacked
		s.LeasesExpired += t.LeasesExpired
		s.DeadLettered += t.DeadLettered
		s.Replayed += t.Replayed
		s.At = at
	}
}

// GroupTallies answers a copy of the per-group sums of applied events
// (only groups that had any).
func (n *Node) GroupTallies() map[fsm.TopicGroup]TallyAt {
	m := n.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[fsm.TopicGroup]TallyAt, len(m.tallies))
	for k, t := range m.tallies {
		out[k] = *t
	}
	return out
}

// DropGroupTallies forgets the sums of groups that a view of the state
// at applied index upTo did not hold (deleted groups), unless events were
// added to them after upTo (a group created since).
func (n *Node) DropGroupTallies(keys []fsm.TopicGroup, upTo uint64) {
	m := n.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range keys {
		if t := m.tallies[k]; t != nil && t.At <= upTo {
			delete(m.tallies, k)
		}
	}
}

// raftStates are the values of mqd_raft_state's state label.
var raftStates = []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown}

var (
	descRaftState   = prometheus.NewDesc("mqd_raft_state", "1 on this node's current raft state, 0 on the others.", []string{"state"}, nil)
	descCommitIndex = prometheus.NewDesc("mqd_raft_commit_index", "Highest raft index this node knows to be committed.", nil, nil)
	descApplied     = prometheus.NewDesc("mqd_raft_applied_index", "Last raft index applied to this node's state.", nil, nil)
	descLastIndex   = prometheus.NewDesc("mqd_raft_last_log_index", "Last index in this node's raft log.", nil, nil)
	descTerm        = prometheus.NewDesc("mqd_raft_term", "This node's current raft term.", nil, nil)
	descWheel       = prometheus.NewDesc("mqd_timing_wheel_timers", "Due times in the leader's timing wheel (0 on followers).", nil, nil)
	descFormat      = prometheus.NewDesc("mqd_state_format",
		"Format of the replicated state as this node applied it; the leader raises it once every member's binary reads the next one.", nil, nil)
)

// nodeCollector reads raft's indexes and state at scrape time.
type nodeCollector struct{ n *Node }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descCommitIndex, descApplied, descLastIndex, descTerm, descWheel, descFormat} {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.n.Raft.State()
	for _, s := range raftStates {
		v := 0.0
		if s == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, strings.ToLower(s.String()))
	}
	ch <- prometheus.MustNewConstMetric(descCommitIndex, prometheus.GaugeValue, float64(c.n.Raft.CommitIndex()))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(c.n.FSM.AppliedIndex()))
	ch <- prometheus.MustNewConstMetric(descLastIndex, prometheus.GaugeValue, float64(c.n.Raft.LastIndex()))
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(c.n.Raft.CurrentTerm()))
	wheel := 0.0
	if c.n.sched.active.Load() {
		wheel = float64(c.n.sched.wheel.Len())
	}
	ch <- prometheus.MustNewConstMetric(descWheel, prometheus.GaugeValue, wheel)
	ch <- prometheus.MustNewConstMetric(descFormat, prometheus.GaugeValue, float64(c.n.FSM.StateFormat()))
}

// Collectors returns the node's Prometheus collectors.
func (n *Node) Collectors() []prometheus.Collector {
	m := n.metrics
	cs := append(n.batch.Collectors(),
		m.leaderChanges, m.snapshots, m.snapshotTime, m.snapshotBytes, m.snapshotWritten, m.recoveries,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mqd_raft_applied_bytes_total",
			Help: "Bytes of raft log entries this node applied since it started."},
			func() float64 { return float64(n.FSM.AppliedBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_raft_log_bytes_since_snapshot",
			Help: "Bytes of raft log past this node's latest snapshot (counted again after a restart, as raft replays them); a snapshot is due at half the state's size (snapshots.go)."},
			func() float64 { return float64(n.FSM.BytesSinceSnapshot()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mqd_raft_snapshot_restores_total",
			Help: "Snapshots this node restored (at start, or sent by the leader)."},
			func() float64 { return float64(n.FSM.Restores()) }),
		raftTimings.commit, raftTimings.apply, nodeCollector{n})
	cs = append(cs, n.clockCollectors()...)
	cs = append(cs, n.lostCollectors()...)
	return append(cs, n.disk.collectors()...)
}

// raftTimings receives hashicorp/raft's own timings (it reports through
// go-metrics, a process-wide sink) and keeps the two that matter:
// commit latency on the leader and the FSM's apply time per batch.
var raftTimings = &raftSink{
	commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_commit_seconds",
		Help:    "Leader: time from dispatching a log entry to its commit on a majority (raft's commitTime).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_apply_seconds",
		Help:    "Time to apply one batch of committed entries to this node's state (raft's fsm.applyBatch).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
}

var installSink sync.Once

// installRaftSink routes go-metrics (raft's telemetry) into raftTimings,
// once per process.
func installRaftSink() {
	installSink.Do(func() {
		cfg := gometrics.DefaultConfig("")
		cfg.EnableHostname = false
		cfg.EnableRuntimeMetrics = false
		_, _ = gometrics.NewGlobal(cfg, raftTimings)
	})
}

// raftSink is a go-metrics sink that keeps raft's commit and apply timers
// (milliseconds) and drops everything else.
type raftSink struct {
	gometrics.BlackholeSink
	commit, apply prometheus.Histogram
}

func (s *raftSink) AddSample(key []string, val float32) { s.AddSampleWithLabels(key, val, nil) }

func (s *raftSink) AddSampleWithLabels(key []string, val float32, _ []gometrics.Label) {
	switch {
	case len(key) == 2 && key[0] == "raft" && key[1] == "commitTime":
		s.commit.Observe(float64(val) / 1000)
	case len(key) == 3 && key[0] == "raft" && key[1] == "fsm" && (key[2] == "applyBatch" || key[2] == "apply"):
		s.apply.Observe(float64(val) / 1000)
	}
}

// watch follows raft's observations until ctx ends: it counts leader
// changes and says once when a peer stops answering the leader's
// heartbeats and once when it answers again (raft's own per-attempt lines
// are debug, see hclogAdapter).
func (n *Node) watch(ctx context.Context) {
	var leader raft.ServerID
	down := map[raft.ServerID]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-n.observed:
			switch d := o.Data.(type) {
			case raft.LeaderObservation:
				if d.LeaderID != leader {
					leader = d.LeaderID
					n.metrics.leaderChanges.Inc()
				}
				if d.LeaderID != raft.ServerID(n.cfg.ID) {
					clear(down) // only a leader watches its peers
					n.raftDown.Clear()
				}
			case raft.FailedHeartbeatObservation:
				if _, ok := down[d.PeerID]; !ok {
					down[d.PeerID] = time.Now()
					n.raftDown.Store(string(d.PeerID), true)
					n.logger.Warn("raft peer unreachable", "peer", string(d.PeerID),
						"last_contact", d.LastContact.UTC().Format(time.RFC3339Nano))
				}
			case raft.ResumedHeartbeatObservation:
				if since, ok := down[d.PeerID]; ok {
					delete(down, d.PeerID)
					n.raftDown.Delete(string(d.PeerID))
					n.logger.Info("raft peer reachable again", "peer", string(d.PeerID),
						"down_for", time.Since(since).Round(time.Millisecond).String())
				}
			}
		}
	}
}
