package api

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"
)

// metrics are the HTTP layer's Prometheus families; the node adds its own
// (raftfsm.Node.Collectors: each group's, replica.Group.Collectors), and the per-topic and per-group series of the
// state are written apart (statemetrics.go). Labels are bounded: topics,
// groups, route patterns, status codes; never keys, offsets or paths.
type metrics struct {
	reg         *prometheus.Registry
	published   *prometheus.CounterVec
	duplicates  *prometheus.CounterVec
	receipts    *prometheus.CounterVec
	requests    *prometheus.CounterVec
	requestTime *prometheus.HistogramVec
	commitLat   prometheus.Histogram

	mu    sync.Mutex
	known map[string]bool // topics whose published and duplicates series exist
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), known: map[string]bool{}}
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
	m.reg.MustRegister(m.published, m.duplicates, m.receipts, m.requests, m.requestTime, m.commitLat,
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
	return m
}

func (m *metrics) commit(d time.Duration, err error) {
	if err == nil {
		m.commitLat.Observe(d.Seconds())
	}
}

func (m *metrics) countPublished(topic string, ps []fsm.Published) {
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
	m.countRequest(route, code)
	m.requestTime.WithLabelValues(route).Observe(d.Seconds())
}

// countRequest counts an answer without timing it: one written before
// routing, whose request's start fasthttp does not keep.
func (m *metrics) countRequest(route string, code int) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}

// textFormat is the exposition /metrics answers in, whatever the
// client's Accept header offers (Prometheus accepts it always).
var textFormat = expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.UnderscoreEscaping)

// metricsHandler answers the registry's families, then the per-topic and
// per-group series of the state (statemetrics.go), as Prometheus text,
// gzipped when the client accepts it.
func (s *Server) metricsHandler(ctx *fasthttp.RequestCtx, _ *route) error {
	rows := s.stateRows()
	topics := make([]string, len(rows.topics))
	for i, t := range rows.topics {
		topics[i] = t.name
	}
	s.syncTopicSeries(topics)
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		return fmt.Errorf("gather metrics: %w", err)
	}
	b := bytes.NewBuffer(make([]byte, 0, rows.size()+256<<10))
	enc := expfmt.NewEncoder(b, textFormat)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("encode metrics: %w", err)
		}
	}
	body := rows.appendText(b.Bytes())
	ctx.SetContentType(string(textFormat))
	ctx.Response.Header.Add("Vary", "Accept-Encoding")
	if ctx.Request.Header.HasAcceptEncoding("gzip") {
		ctx.Response.Header.Set("Content-Encoding", "gzip")
		body = fasthttp.AppendGzipBytesLevel(nil, body, fasthttp.CompressBestSpeed)
	}
	ctx.Response.SetBodyRaw(body) // not copied: nothing else holds it
	return nil
}

// syncTopicSeries makes the per-topic counters show 0 for every existing
// topic (so that a family exists, and rate() sees its first event), and
// drops the series of deleted ones.
func (s *Server) syncTopicSeries(topics []string) {
	m := s.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	now := make(map[string]bool, len(topics))
	for _, t := range topics {
		now[t] = true
		if !m.known[t] {
			m.known[t] = true
			m.published.WithLabelValues(t)
			m.duplicates.WithLabelValues(t)
		}
	}
	for t := range m.known {
		if !now[t] {
			delete(m.known, t)
			m.published.DeleteLabelValues(t)
			m.duplicates.DeleteLabelValues(t)
		}
	}
}
