package api

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
)

// RateLimits bound how many requests a client may send to one node, so
// that no client starves the others. Each is requests per second, with
// bursts of up to one second's worth; 0 means no limit.
type RateLimits struct {
	// PerToken limits each token of --auth-file (not used without auth).
	PerToken float64
	// PerConnection limits each client connection. Connections of nodes
	// presenting the cluster's certificate (forwarding followers) are
	// exempt: they carry many clients' requests.
	PerConnection float64
}

// DefaultRateLimits are generous: they stop a runaway client, not a busy one.
func DefaultRateLimits() RateLimits { return RateLimits{PerToken: 10000, PerConnection: 2000} }

// ErrRateLimited is a request over its token's or connection's rate.
var ErrRateLimited = errors.New("rate limited")

// rateLimitedError carries when the client may retry.
type rateLimitedError struct {
	what  string
	after time.Duration
}

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("%v: too many requests on this %s, retry in %v", ErrRateLimited, e.what, e.after.Round(time.Millisecond))
}

func (e *rateLimitedError) Unwrap() error { return ErrRateLimited }

// retryAfter is the Retry-After value of err's wait: whole seconds, at least 1.
func retryAfter(err error) (string, bool) {
	var rl *rateLimitedError
	if !errors.As(err, &rl) {
		return "", false
	}
	return strconv.Itoa(max(1, int(math.Ceil(rl.after.Seconds())))), true
}

// limiters holds one token bucket per token name and per open connection.
type limiters struct {
	cfg    RateLimits
	mu     sync.Mutex
	tokens map[string]*rate.Limiter
	conns  map[net.Conn]*rate.Limiter
}

func newLimiters(cfg RateLimits) *limiters {
	return &limiters{cfg: cfg, tokens: map[string]*rate.Limiter{}, conns: map[net.Conn]*rate.Limiter{}}
}

func newLimiter(perSec float64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(perSec), max(1, int(math.Ceil(perSec))))
}

// connection charges one request to c's bucket.
func (l *limiters) connection(c net.Conn) error {
	if l.cfg.PerConnection <= 0 || c == nil {
		return nil
	}
	return take(bucket(&l.mu, l.conns, c, l.cfg.PerConnection), "connection")
}

// token charges one request to the bucket of the token named name.
func (l *limiters) token(name string) error {
	if l.cfg.PerToken <= 0 {
		return nil
	}
	return take(bucket(&l.mu, l.tokens, name, l.cfg.PerToken), "token")
}

// bucket is m's limiter for k, made at perSec on first use.
func bucket[K comparable](mu *sync.Mutex, m map[K]*rate.Limiter, k K, perSec float64) *rate.Limiter {
	mu.Lock()
	defer mu.Unlock()
	lim, ok := m[k]
	if !ok {
		lim = newLimiter(perSec)
		m[k] = lim
	}
	return lim
}

// connState forgets a connection's bucket when it closes.
func (l *limiters) connState(c net.Conn, st fasthttp.ConnState) {
	if st == fasthttp.StateClosed || st == fasthttp.StateHijacked {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
	}
}

// take takes one request from lim, or answers how long until it could.
func take(lim *rate.Limiter, what string) error {
	now := time.Now()
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return &rateLimitedError{what: what, after: time.Second}
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return &rateLimitedError{what: what, after: d}
	}
	return nil
}
