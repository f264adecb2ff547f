package api

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// routeSeries are one route's request series, resolved once: the
// histogram child and a counter child per status code seen. A request then
// costs no label hashing and no lookup in the vectors (the vectors'
// WithLabelValues was ~5 % of a publish's handler CPU).
type routeSeries struct {
	time  atomic.Pointer[prometheus.Observer]
	codes atomic.Pointer[[]codeCounter] // copy on write: few codes per route
	mu    sync.Mutex                    // serializes adding a code
}

type codeCounter struct {
	code int
	c    prometheus.Counter
}

// routeSeriesFor holds a routeSeries per route of the table, made when the
// server is built and read without a lock after.
func routeSeriesFor(rs []Route) map[string]*routeSeries {
	out := make(map[string]*routeSeries, len(rs))
	for _, r := range rs {
		out[r.Pattern] = &routeSeries{}
	}
	return out
}

// observeRoute counts and times an answer on a matched route, as
// metrics.observeRequest does, through the route's resolved series. A
// series is created on its first answer, as WithLabelValues would.
func (s *Server) observeRoute(pattern string, code int, d time.Duration) {
	rs := s.series[pattern]
	if rs == nil {
		s.metrics.observeRequest(pattern, code, d)
		return
	}
	rs.counter(s.metrics, pattern, code).Inc()
	o := rs.time.Load()
	if o == nil {
		h := s.metrics.requestTime.WithLabelValues(pattern)
		o = &h
		rs.time.Store(o)
	}
	(*o).Observe(d.Seconds())
}

func (rs *routeSeries) counter(m *metrics, pattern string, code int) prometheus.Counter {
	if cs := rs.codes.Load(); cs != nil {
		for _, c := range *cs {
			if c.code == code {
				return c.c
			}
		}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var cur []codeCounter
	if cs := rs.codes.Load(); cs != nil {
		cur = *cs
	}
	for _, c := range cur {
		if c.code == code {
			return c.c
		}
	}
	c := m.requests.WithLabelValues(pattern, strconv.Itoa(code))
	next := append(append(make([]codeCounter, 0, len(cur)+1), cur...), codeCounter{code, c})
	rs.codes.Store(&next)
	return c
}
