package api

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
)

// budgetFree is the body size admitted without counting: small requests
// (fetch, ack, most publishes) never wait on the budget.
const budgetFree = 64 << 10

// bodyBudget admits request bodies against a node-wide budget of bytes in
// flight, decided from the head (Content-Length; a chunked body counts as
// the largest allowed) before the body is read: a request over the budget
// is answered 503 with Retry-After and its body is never read. The bytes
// stay counted until the request has been answered, which covers its
// decoding, its command and its wait for the commit. Memory therefore
// holds at most the budget in bodies (plus what each costs to process),
// however many clients send large bodies at once.
type bodyBudget struct {
	max     int64
	used    atomic.Int64
	mu      sync.Mutex
	held    map[*fasthttp.RequestHeader]int64 // each request's reservation
	refused prometheus.Counter
	inUse   prometheus.GaugeFunc
}

func newBodyBudget(max int64) *bodyBudget {
	b := &bodyBudget{max: max, held: map[*fasthttp.RequestHeader]int64{}}
	b.refused = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_http_body_budget_refused_total",
		Help: "Requests answered 503 because the in-flight request body budget was spent."})
	b.inUse = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_http_body_budget_bytes",
		Help: "Request body bytes admitted and not yet answered."}, func() float64 { return float64(b.used.Load()) })
	return b
}

func (b *bodyBudget) collectors() []prometheus.Collector {
	return []prometheus.Collector{b.refused, b.inUse}
}

// refusedHeader marks a request the budget refused, for parseError. A
// client's own copy of it is removed first.
const refusedHeader = "X-Mqd-Internal-Budget-Refused"

// admit reserves the body of the request whose head is h, or refuses it:
// then the request's body limit is set below its length, so fasthttp
// answers through parseError without reading it.
func (b *bodyBudget) admit(h *fasthttp.RequestHeader) (refused bool) {
	h.Del(refusedHeader)
	b.release(h) // a reservation left by a request that never finished
	n := int64(h.ContentLength())
	if n < 0 { // chunked, or no length
		n = maxBodyBytes
	}
	if n <= budgetFree || n > maxBodyBytes {
		// Small; or over the body limit, which fasthttp answers 413
		// without reading it (a 503 would only invite a useless retry).
		return false
	}
	for {
		used := b.used.Load()
		if used+n > b.max {
			b.refused.Inc()
			h.Set(refusedHeader, "1")
			return true
		}
		if b.used.CompareAndSwap(used, used+n) {
			break
		}
	}
	b.mu.Lock()
	b.held[h] = n
	b.mu.Unlock()
	return false
}

// release returns the reservation of the request whose head is h, if any.
func (b *bodyBudget) release(h *fasthttp.RequestHeader) {
	b.mu.Lock()
	n, ok := b.held[h]
	delete(b.held, h)
	b.mu.Unlock()
	if ok {
		b.used.Add(-n)
	}
}

// errBudget is the answer to a request refused by the budget.
func (b *bodyBudget) errBudget() error {
	return fmt.Errorf("%w: the node is receiving its most request bytes at once (%d MiB); retry", ErrUnavailable, b.max>>20)
}
