package api

import (
	"strconv"

	mlog "github.com/mqd/mqd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	bolt "go.etcd.io/bbolt"
)

type metrics struct {
	reg       *prometheus.Registry
	published prometheus.Counter
	dedupHits prometheus.Counter
	acks      *prometheus.CounterVec
	requests  *prometheus.CounterVec
	commitLat prometheus.Histogram
	handler   fasthttp.RequestHandler
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.published = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_published_messages_total",
		Help: "Messages published through this node while it led."})
	m.dedupHits = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_publish_duplicates_total",
		Help: "Publishes answered as duplicates (idempotency key or producer sequence)."})
	m.acks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_receipts_total",
		Help: "Receipts of ack, nack and extend by operation and result (ok, stale, invalid)."}, []string{"op", "status"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_http_requests_total",
		Help: "HTTP requests by status code."}, []string{"code"})
	m.commitLat = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_publish_commit_seconds",
		Help: "Time from proposing a publish to its commit and apply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	m.reg.MustRegister(m.published, m.dedupHits, m.acks, m.requests, m.commitLat, &stateCollector{s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(s.node.Collectors()...)
	m.handler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return m
}

func (m *metrics) commit(ms int64, err error) {
	if err == nil {
		m.commitLat.Observe(float64(ms) / 1000)
	}
}

func (m *metrics) countReceipts(op string, statuses []string) {
	for _, st := range statuses {
		m.acks.WithLabelValues(op, st).Inc()
	}
}

func (m *metrics) observeRequest(code int) {
	m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
}

func (s *Server) metricsHandler(ctx *fasthttp.RequestCtx, _ *route) error {
	s.metrics.handler(ctx)
	return nil
}

// stateCollector reads raft state and per-group figures at scrape time.
type stateCollector struct{ s *Server }

var (
	descRaftState = prometheus.NewDesc("mqd_raft_state", "1 for this node's current raft state.", []string{"state"}, nil)
	descApplied   = prometheus.NewDesc("mqd_raft_applied_index", "Last applied raft index.", nil, nil)
	descMessages  = prometheus.NewDesc("mqd_topic_messages", "Retained messages per topic.", []string{"topic"}, nil)
	descGroup     = prometheus.NewDesc("mqd_group_messages", "Messages per group by state.", []string{"topic", "group", "state"}, nil)
	descGroupDone = prometheus.NewDesc("mqd_group_acked_total", "Messages acked per group.", []string{"topic", "group"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descApplied, descMessages, descGroup, descGroupDone} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, 1, stateName(c.s.node.Raft.State().String()))
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.GaugeValue, float64(c.s.node.FSM.AppliedIndex()))
	now := nowMs()
	_ = c.s.node.FSM.View(func(tx *bolt.Tx) error {
		for _, t := range mlog.Topics(tx) {
			st, err := readTopicStats(tx, t, now)
			if err != nil {
				continue
			}
			ch <- prometheus.MustNewConstMetric(descMessages, prometheus.GaugeValue, float64(st.Messages), t)
			for g, gs := range st.Groups {
				for state, v := range map[string]uint64{"backlog": gs.Backlog, "in_flight": gs.InFlight, "delayed": gs.Delayed, "dlq": gs.DLQ} {
					ch <- prometheus.MustNewConstMetric(descGroup, prometheus.GaugeValue, float64(v), t, g, state)
				}
				ch <- prometheus.MustNewConstMetric(descGroupDone, prometheus.CounterValue, float64(gs.Acked), t, g)
			}
		}
		return nil
	})
}
