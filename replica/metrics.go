package replica

import (
	"strings"
	"sync"

	gometrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/prometheus/client_golang/prometheus"
)

// groupMetrics are a group's Prometheus collectors, each labelled with
// the group's id (GroupLabel), so that several groups register side by
// side: raft's state and indexes, snapshots and leadership; and what the
// FSM applied per topic and consumer group (counted only for entries this
// replica had not applied before it started), kept as plain sums that the
// HTTP layer's scrape writes out (GroupTallies) next to the state's
// per-group gauges.
type groupMetrics struct {
	labels  prometheus.Labels // {raft_group: id}
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
	// lostFound counts the times the lost-log guard restricted the
	// replica (lostlog.go).
	lostFound prometheus.Counter
}

func (m *groupMetrics) recovery(reason string) { m.recoveries.WithLabelValues(reason).Inc() }

// TallyAt is a consumer group's sums of applied events, with the applied
// index they were last added at.
type TallyAt struct {
	group.Tally
	At uint64
}

func newGroupMetrics(id string) *groupMetrics {
	l := prometheus.Labels{GroupLabel: id}
	return &groupMetrics{
		labels:  l,
		tallies: map[fsm.TopicGroup]*TallyAt{},
		applied: func() uint64 { return 0 },
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_leader_changes_total", ConstLabels: l,
			Help: "Times this node saw the group's leader change (including to none)."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_snapshots_total", ConstLabels: l,
			Help: "Snapshots this node took."}),
		snapshotTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_snapshot_seconds", ConstLabels: l,
			Help: "Time to take a snapshot (copy the state to the snapshot store).", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mqd_raft_snapshot_bytes", ConstLabels: l,
			Help: "Size of this node's latest snapshot."}),
		snapshotWritten: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_snapshot_written_bytes_total", ConstLabels: l,
			Help: "Bytes of snapshots this node took (the sum of their sizes)."}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_fsm_recoveries_total", ConstLabels: l,
			Help: "Decisions taken at start about fsm.db and the snapshots: opened at the last checkpoint after an unclean stop (unclean_stop), or set aside and rebuilt, by what was found."},
			[]string{"reason"}),
		lostFound: prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_raft_lost_entries_found_total", ConstLabels: l,
			Help: "Times this node found that its raft log lost, or a leader would replace, entries its state applied (it then stops voting: mqd_raft_vote_restricted)."}),
	}
}

// tally adds a batch's events to the sums (called after the batch is
// applied, so the applied index covers it).
func (m *groupMetrics) tally(ts map[fsm.TopicGroup]*group.Tally) {
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

// GroupTallies answers a copy of the per-consumer-group sums of applied
// events (only consumer groups that had any).
func (g *Group) GroupTallies() map[fsm.TopicGroup]TallyAt {
	m := g.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[fsm.TopicGroup]TallyAt, len(m.tallies))
	for k, t := range m.tallies {
		out[k] = *t
	}
	return out
}

// DropGroupTallies forgets the sums of consumer groups that a view of the
// state at applied index upTo did not hold (deleted groups), unless events
// were added to them after upTo (a group created since).
func (g *Group) DropGroupTallies(keys []fsm.TopicGroup, upTo uint64) {
	m := g.metrics
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

// groupDescs are the descriptions of what groupCollector reads at scrape
// time, labelled with one group's id.
type groupDescs struct {
	state, commit, applied, last, snapshot, term, wheel, format *prometheus.Desc
}

func newGroupDescs(l prometheus.Labels) groupDescs {
	return groupDescs{
		state:   prometheus.NewDesc("mqd_raft_state", "1 on this node's current raft state, 0 on the others.", []string{"state"}, l),
		commit:  prometheus.NewDesc("mqd_raft_commit_index", "Highest raft index this node knows to be committed.", nil, l),
		applied: prometheus.NewDesc("mqd_raft_applied_index", "Last raft index applied to this node's state.", nil, l),
		last:    prometheus.NewDesc("mqd_raft_last_log_index", "Last index in this node's raft log.", nil, l),
		snapshot: prometheus.NewDesc("mqd_raft_last_snapshot_index",
			"Raft index of this node's latest snapshot of the group (GET /v1/cluster's last_snapshot_index is the default group's).", nil, l),
		term:  prometheus.NewDesc("mqd_raft_term", "This node's current raft term.", nil, l),
		wheel: prometheus.NewDesc("mqd_timing_wheel_timers", "Due times in the leader's timing wheel (0 on followers).", nil, l),
		format: prometheus.NewDesc("mqd_state_format",
			"Format of the replicated state as this node applied it; the leader raises it once every member's binary reads the next one.", nil, l),
	}
}

// groupCollector reads raft's indexes and state at scrape time.
type groupCollector struct {
	g *Group
	d groupDescs
}

func (c groupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.d.state, c.d.commit, c.d.applied, c.d.last, c.d.snapshot, c.d.term, c.d.wheel, c.d.format} {
		ch <- d
	}
}

func (c groupCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.g.raft
	cur := r.State()
	for _, s := range raftStates {
		v := 0.0
		if s == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.d.state, prometheus.GaugeValue, v, strings.ToLower(s.String()))
	}
	ch <- prometheus.MustNewConstMetric(c.d.commit, prometheus.GaugeValue, float64(r.CommitIndex()))
	ch <- prometheus.MustNewConstMetric(c.d.applied, prometheus.GaugeValue, float64(c.g.fsm.AppliedIndex()))
	ch <- prometheus.MustNewConstMetric(c.d.last, prometheus.GaugeValue, float64(r.LastIndex()))
	ch <- prometheus.MustNewConstMetric(c.d.snapshot, prometheus.GaugeValue, float64(c.g.LastSnapshotIndex()))
	ch <- prometheus.MustNewConstMetric(c.d.term, prometheus.GaugeValue, float64(r.CurrentTerm()))
	wheel := 0.0
	if c.g.sched.active.Load() {
		wheel = float64(c.g.sched.wheel.Len())
	}
	ch <- prometheus.MustNewConstMetric(c.d.wheel, prometheus.GaugeValue, wheel)
	ch <- prometheus.MustNewConstMetric(c.d.format, prometheus.GaugeValue, float64(c.g.fsm.StateFormat()))
}

// Collectors returns the group's Prometheus collectors, every one
// labelled with its id. Raft's own commit and apply timings are not among
// them: raft reports those process-wide (RaftTimings).
func (g *Group) Collectors() []prometheus.Collector {
	m, l, f := g.metrics, g.metrics.labels, g.fsm
	cs := append(g.batch.Collectors(),
		m.leaderChanges, m.snapshots, m.snapshotTime, m.snapshotBytes, m.snapshotWritten, m.recoveries, m.lostFound,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mqd_raft_applied_bytes_total", ConstLabels: l,
			Help: "Bytes of raft log entries this node applied since it started."},
			func() float64 { return float64(f.AppliedBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_raft_log_bytes_since_snapshot", ConstLabels: l,
			Help: "Bytes of raft log past this node's latest snapshot (counted again after a restart, as raft replays them); a snapshot is due at half the state's size (replica/snappolicy.go)."},
			func() float64 { return float64(f.BytesSinceSnapshot()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "mqd_raft_snapshot_restores_total", ConstLabels: l,
			Help: "Snapshots this node restored (at start, or sent by the leader)."},
			func() float64 { return float64(f.Restores()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_raft_vote_restricted", ConstLabels: l,
			Help: "1 while this node neither votes nor stands for election: its raft log lost entries its state applied (or a leader sent entries that differ from them); /readyz says why."},
			func() float64 {
				if g.lost.restricted() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_raft_vote_restricted_index", ConstLabels: l,
			Help: "The raft index this node's log must hold (at the term its state applied there) before it votes again; 0 when it votes."},
			func() float64 { return float64(g.lost.index()) }),
		groupCollector{g: g, d: newGroupDescs(l)})
	return cs
}

// RaftTimings are raft's own commit and apply timings, for the whole
// process: hashicorp/raft reports them through go-metrics, a process-wide
// sink, without telling one raft instance from another.
func RaftTimings() []prometheus.Collector {
	return []prometheus.Collector{raftTimings.commit, raftTimings.apply}
}

// raftTimings receives hashicorp/raft's own timings and keeps the two that
// matter: commit latency on the leader and the FSM's apply time per batch.
var raftTimings = &raftSink{
	commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_commit_seconds",
		Help:    "Leader: time from dispatching a log entry to its commit on a majority (raft's commitTime), over every group of the node.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	apply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_raft_apply_seconds",
		Help:    "Time to apply one batch of committed entries to this node's state (raft's fsm.applyBatch), over every group of the node.",
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
