package api

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/replica"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/valyala/fasthttp"
)

// metrics are the HTTP layer's Prometheus families; the node adds its own
// (raftfsm.Node.Collectors: each group's, replica.Group.Collectors), and
// the per-topic and per-group series of the state, with the per-topic
// publish counters, are written apart (statemetrics.go). Labels are
// bounded: topics, groups, route patterns, status codes; never keys,
// offsets or paths.
type metrics struct {
	reg         *prometheus.Registry
	receipts    *prometheus.CounterVec
	requests    *prometheus.CounterVec
	requestTime *prometheus.HistogramVec
	commitLat   prometheus.Histogram
	// Coalesced forwarding (coalesce.go), counted on the follower.
	fwdCommands, fwdRequests prometheus.Counter
	// HTTP forwards, counted on the forwarding node by target.
	forwards *prometheus.CounterVec

	published topicCounters // mqd_published_messages_total, mqd_publish_duplicates_total
	scrapes   scrapes       // builds of /metrics' body, one at a time
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), published: topicCounters{m: map[string]*topicCount{}}}
	m.receipts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_receipts_total",
		Help: "Receipts of ack, nack and extend by operation and result (ok, stale, invalid)."}, []string{"op", "status"})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_http_requests_total",
		Help: "HTTP requests this node answered, by route pattern and status code."}, []string{"route", "code"})
	m.requestTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "mqd_http_request_seconds",
		Help:    "Time to answer an HTTP request, by route pattern (a fetch includes its long-poll wait).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route"})
	m.commitLat = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mqd_publish_commit_seconds",
		Help: "Leader: time from proposing a publish to its commit on a majority and apply.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	m.fwdCommands = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_forward_coalesced_commands_total",
		Help: "Follower: commands (publishes) sent to a leader on its coalesced-forward stream."})
	m.fwdRequests = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_forward_coalesced_requests_total",
		Help: "Follower: writes on the coalesced-forward streams that carried them (commands per write is the coalescing)."})
	m.forwards = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_forwarded_requests_total",
		Help: "HTTP requests this node forwarded (each attempt): to the leader of the group serving them (to=leader), or, for a topic of a data group whose leader it does not know or cannot reach, to a member of the group (to=member)."},
		[]string{"to"})
	for _, to := range []string{forwardToLeader, forwardToMember} {
		m.forwards.WithLabelValues(to)
	}
	m.reg.MustRegister(m.receipts, m.requests, m.requestTime, m.commitLat, m.fwdCommands, m.fwdRequests, m.forwards,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(s.node.Collectors()...)
	if dn, ok := s.node.(interface {
		OnDataGroup(func(*replica.Group))
	}); ok {
		// A data group's series carry its raft_group label. A group this
		// node left and holds again (a move back) replaces its series.
		var mu sync.Mutex
		had := map[string][]prometheus.Collector{}
		dn.OnDataGroup(func(g *replica.Group) {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range had[g.ID()] {
				m.reg.Unregister(c)
			}
			cs := g.Collectors()
			had[g.ID()] = cs
			for _, c := range cs {
				if err := m.reg.Register(c); err != nil {
					s.logger.Warn("register a data group's metrics", "group", g.ID(), "err", err)
				}
			}
		})
	}
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

// The targets of mqd_forwarded_requests_total.
const (
	forwardToLeader = "leader"
	forwardToMember = "member"
)

func (m *metrics) countForward(to string) { m.forwards.WithLabelValues(to).Inc() }

func (m *metrics) commit(d time.Duration, err error) {
	if err == nil {
		m.commitLat.Observe(d.Seconds())
	}
}

func (m *metrics) countPublished(topic string, ps []fsm.Published) {
	var stored, dup uint64
	for _, p := range ps {
		if p.Duplicate {
			dup++
		} else {
			stored++
		}
	}
	if stored > 0 || dup > 0 {
		c := m.published.get(topic)
		c.published.Add(stored)
		c.duplicates.Add(dup)
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
// gzipped when the client accepts it. Scrapes that arrive while a body is
// being built share the next one (scrapes.get): they pile up on one
// build, not on the CPU.
func (s *Server) metricsHandler(ctx *fasthttp.RequestCtx, _ *route) error {
	body, err := s.metrics.scrapes.get(ctx, s.metricsText)
	if err != nil {
		return err
	}
	ctx.SetContentType(string(textFormat))
	ctx.Response.Header.Add("Vary", "Accept-Encoding")
	if ctx.Request.Header.HasAcceptEncoding("gzip") {
		ctx.Response.Header.Set("Content-Encoding", "gzip")
		body = fasthttp.AppendGzipBytesLevel(nil, body, fasthttp.CompressBestSpeed)
	}
	ctx.Response.SetBodyRaw(body) // not copied: nothing writes to it after its build
	return nil
}

// metricsText builds one body of /metrics: it reads the state's figures
// (one read transaction), then writes the registry's families and after
// them the state's series.
func (s *Server) metricsText() ([]byte, error) {
	rows := s.stateRows()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather metrics: %w", err)
	}
	b := bytes.NewBuffer(make([]byte, 0, rows.size()+256<<10))
	enc := expfmt.NewEncoder(b, textFormat)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, fmt.Errorf("encode metrics: %w", err)
		}
	}
	return rows.appendText(b.Bytes()), nil
}

// scrapes runs the builds of /metrics' body one at a time. A scrape that
// finds none running starts one; one that finds a build running waits for
// the build that starts after it (the figures must be from after the
// scrape arrived: a test or an operator reads what it just did), which
// every scrape arriving meanwhile shares. However many scrapes pile up, at
// most one build runs and one waits. No body is kept once answered.
type scrapes struct {
	mu      sync.Mutex
	running *build // nil: none
	next    *build // the build the scrapes waiting on running share
	waiting int    // scrapes waiting for the running build to end
	hint    rowsHint
}

// build is one body of /metrics, ready once done is closed.
type build struct {
	done chan struct{}
	body []byte
	err  error
}

// get answers a body built after it was called, or ctx's error.
func (c *scrapes) get(ctx context.Context, fn func() ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if c.running == nil {
		b := c.next
		if b == nil {
			b = &build{done: make(chan struct{})}
		}
		c.next = nil
		return c.run(b, fn)
	}
	if c.next == nil {
		c.next = &build{done: make(chan struct{})}
	}
	prev, b := c.running, c.next
	c.waiting++
	c.mu.Unlock()
	var err error
	select {
	case <-prev.done:
	case <-ctx.Done():
		err = fmt.Errorf("wait for a scrape: %w", ctx.Err())
	}
	c.mu.Lock()
	c.waiting--
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if c.next == b && c.running == nil {
		c.next = nil
		return c.run(b, fn)
	}
	c.mu.Unlock()
	select {
	case <-b.done:
		return b.body, b.err
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a scrape: %w", ctx.Err())
	}
}

// run builds b with c.mu held on entry (it unlocks it) and answers it.
func (c *scrapes) run(b *build, fn func() ([]byte, error)) ([]byte, error) {
	c.running = b
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = nil
		c.mu.Unlock()
		close(b.done)
	}()
	b.body, b.err = fn()
	return b.body, b.err
}

// topicCounters are the per-topic publish counters, kept as plain sums and
// written with the state's per-topic series: through the registry, 20,000
// series of 10,000 topics cost a fifth of a scrape.
type topicCounters struct {
	mu sync.RWMutex
	m  map[string]*topicCount
}

type topicCount struct {
	published, duplicates atomic.Uint64
	// seen: a scrape found the topic in the state; once a later one does
	// not, the topic was deleted and its sums are dropped.
	seen atomic.Bool
}

// get answers topic's sums, created at 0.
func (t *topicCounters) get(topic string) *topicCount {
	t.mu.RLock()
	c := t.m[topic]
	t.mu.RUnlock()
	if c != nil {
		return c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c = t.m[topic]; c == nil {
		c = &topicCount{}
		t.m[topic] = c
	}
	return c
}

// fill sets each row's publish counters (0 for a topic without any, so
// that the series exists and rate() sees its first event), and, when the
// rows are all the state's (drop), drops the sums of topics a scrape saw
// before and the state no longer holds.
func (t *topicCounters) fill(rows []topicRow, drop bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := make(map[string]struct{}, len(rows))
	for i := range rows {
		r := &rows[i]
		live[r.name] = struct{}{}
		if c := t.m[r.name]; c != nil {
			c.seen.Store(true)
			r.published, r.duplicates = c.published.Load(), c.duplicates.Load()
		}
	}
	for name, c := range t.m {
		if _, ok := live[name]; drop && !ok && c.seen.Load() {
			delete(t.m, name)
		}
	}
}
