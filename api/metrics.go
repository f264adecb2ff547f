package api

import (
	"strconv"
	"sync"
	"time"

	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/raftfsm"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// metrics are the HTTP layer's Prometheus families; the node adds its own
// (raftfsm.Node.Collectors). Labels are bounded: topics, groups, route
// patterns, status codes; never keys, offsets or paths.
type metrics struct {
	reg         *prometheus.Registry
	published   *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	receipts    *prometheus.CounterVec
	requests    *prometheus.CounterVec
	requestTime *prometheus.HistogramVec
	commitLat   prometheus.Histogram
	handler     fasthttp.RequestHandler

	mu    sync.Mutex
	known map[raftfsm.TopicGroup]bool // series made so far; Group "" for a topic's
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), known: map[raftfsm.TopicGroup]bool{}}
	m.published = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_published_messages_total",
		Help: "Messages stored by publishes this node committed as leader (duplicates not included)."}, []string{"topic"})
	m.duplicates = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_publish_duplicates_total",
		Help: "Publishes answered as duplicates (idempotency key or producer sequence) by this node as leader."}, []string{"topic"})
	m.receipts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_receipts_total",
		Help: "Receipts of ack, nack and extend by operation and result (ok, stale, invalid)."}, []string{"op", "status"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_http_requests_total",
		Help: "HTTP requests this node answered, by route pattern and status code."}, []string{"route", "code"})
	m.requestTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mqd_http_request_seconds",
		Help:    "Time to answer an HTTP request, by route pattern (a fetch includes its long-poll wait).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route"})
	m.commitLat = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_publish_commit_seconds",
		Help: "Leader: time from proposing a publish to its commit on a majority and apply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	m.reg.MustRegister(m.published, m.duplicates, m.receipts, m.requests, m.requestTime, m.commitLat, &stateCollector{s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(s.node.Collectors()...)
	for _, op := range []string{"ack", "nack", "extend"} {
		for _, st := range []string{group.StatusOK, group.StatusStale, group.StatusInvalid} {
			m.receipts.WithLabelValues(op, st)
		}
	}
	m.reg.MustRegister(s.conns.collectors()...)
	m.reg.MustRegister(s.budget.collectors()...)
	m.reg.MustRegister(s.polls)
	m.handler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return m
}

func (m *metrics) commit(d time.Duration, err error) {
	if err == nil {
		m.commitLat.Observe(d.Seconds())
	}
}

func (m *metrics) countPublished(topic string, ps []raftfsm.Published) {
	var stored, dup int
	for _, p := range ps {
		if p.Duplicate {
			dup++
		} else {
			stored++
		}
	}
	if stored > 0 {
		m.published.WithLabelValues(topic).Add(float64(stored))
	}
	if dup > 0 {
		m.duplicates.WithLabelValues(topic).Add(float64(dup))
	}
}

func (m *metrics) countReceipts(op string, statuses []string) {
	for _, st := range statuses {
		m.receipts.WithLabelValues(op, st).Inc()
	}
}

func (m *metrics) observeRequest(route string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.requestTime.WithLabelValues(route).Observe(d.Seconds())
}

func (s *Server) metricsHandler(ctx *fasthttp.RequestCtx, _ *route) error {
	s.syncSeries()
	s.metrics.handler(ctx)
	return nil
}

// syncSeries makes the per-topic and per-group counters show 0 for every
// existing topic and group (so that a family exists, and rate() sees its
// first event), and drops the series of deleted ones.
func (s *Server) syncSeries() {
	now := map[raftfsm.TopicGroup]bool{}
	_ = s.node.FSM.Read(func(r *raftfsm.Reader) error {
		r.EachTopicGauges(nowMs(), func(t *raftfsm.TopicGauges) {
			now[raftfsm.TopicGroup{Topic: t.Name}] = true
			for _, g := range t.Groups {
				now[raftfsm.TopicGroup{Topic: t.Name, Group: g.Name}] = true
			}
		})
		return nil
	})
	m := s.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range now {
		if m.known[k] {
			continue
		}
		m.known[k] = true
		if k.Group == "" {
			m.published.WithLabelValues(k.Topic)
			m.duplicates.WithLabelValues(k.Topic)
		} else {
			s.node.GroupSeries(k, true)
		}
	}
	for k := range m.known {
		if now[k] {
			continue
		}
		delete(m.known, k)
		if k.Group == "" {
			m.published.DeleteLabelValues(k.Topic)
			m.duplicates.DeleteLabelValues(k.Topic)
		} else {
			s.node.GroupSeries(k, false)
		}
	}
}

// stateCollector reads per-topic and per-group figures at scrape time from
// counters the FSM keeps (O(topics × groups × partitions), no message is
// read).
type stateCollector struct{ s *Server }

var (
	descTopicMessages = prometheus.NewDesc("mqd_topic_messages", "Retained messages per topic.", []string{"topic"}, nil)
	descTopicBytes    = prometheus.NewDesc("mqd_topic_bytes", "Retained payload bytes per topic.", []string{"topic"}, nil)
	descBacklog       = prometheus.NewDesc("mqd_group_backlog_messages",
		"Messages waiting for delivery to the group: not yet delivered, or waiting for a redelivery (whether or not its backoff has passed).", []string{"topic", "group"}, nil)
	descInFlight = prometheus.NewDesc("mqd_group_in_flight_messages", "Messages leased to the group's consumers and not yet acked.", []string{"topic", "group"}, nil)
	descDLQ      = prometheus.NewDesc("mqd_dlq_messages", "Dead letters in the group's dead-letter store.", []string{"topic", "group"}, nil)
	descAcked    = prometheus.NewDesc("mqd_group_acked_messages_total", "Messages the group acked (kept in the replicated state).", []string{"topic", "group"}, nil)
	descSkipped  = prometheus.NewDesc("mqd_group_duplicates_skipped_total",
		"Messages not delivered to the group because it had already processed their idempotency key.", []string{"topic", "group"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTopicMessages, descTopicBytes, descBacklog, descInFlight, descDLQ, descAcked, descSkipped} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	_ = c.s.node.FSM.Read(func(r *raftfsm.Reader) error {
		r.EachTopicGauges(nowMs(), func(t *raftfsm.TopicGauges) {
			gauge(descTopicMessages, t.Messages, t.Name)
			gauge(descTopicBytes, t.Bytes, t.Name)
			for _, g := range t.Groups {
				gauge(descBacklog, g.Waiting, t.Name, g.Name)
				gauge(descInFlight, g.InFlight, t.Name, g.Name)
				gauge(descDLQ, g.DLQ, t.Name, g.Name)
				ch <- prometheus.MustNewConstMetric(descAcked, prometheus.CounterValue, float64(g.Acked), t.Name, g.Name)
				ch <- prometheus.MustNewConstMetric(descSkipped, prometheus.CounterValue, float64(g.DuplicatesSkipped), t.Name, g.Name)
			}
		})
		return nil
	})
}
