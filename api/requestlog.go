package api

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// RequestIDHeader carries a request's id: the client's, when it sends a
// valid one (1–64 characters of [A-Za-z0-9._:-]), else one the node makes.
// Every answer echoes it, a follower passes it on when it forwards, and
// every log line about the request carries it as request_id.
const RequestIDHeader = "Mq-Request-Id"

// requestID appends the request's id to buf, making one if the client
// sent none (or one that is not a valid id), and sets it on the request so
// that a forward carries it to the leader. It makes no string: the id is
// one only on the log line, when there is one.
func requestID(ctx *fasthttp.RequestCtx, buf []byte) []byte {
	if v := ctx.Request.Header.Peek(RequestIDHeader); validRequestID(v) {
		return append(buf, v...)
	}
	id := strconv.AppendUint(buf, rand.Uint64(), 36)
	ctx.Request.Header.SetBytesV(RequestIDHeader, id)
	return id
}

// requestIDBuf holds the longest valid request id.
type requestIDBuf [64]byte

func validRequestID(v []byte) bool {
	if len(v) == 0 || len(v) > 64 {
		return false
	}
	for _, c := range v {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// logRequest writes the request's one log line: debug, except a failure
// of the server's own (500: error; other 5xx, such as 503 while a leader is
// elected or 507 on a full disk: a warning, at most once per loudEvery per
// route and status, with the count of those not logged). No line per
// message at info. It names the topic, group and idempotency key of
// message-related requests.
func (s *Server) logRequest(ctx *fasthttp.RequestCtx, r *route, id []byte, pattern string, err error, took time.Duration) {
	status := ctx.Response.StatusCode()
	level := slog.LevelDebug
	var skipped int
	switch {
	case status == 500:
		level = slog.LevelError
	case status > 500 && pattern != "/readyz":
		ok, n := s.loud.allow(pattern, status)
		if ok {
			level, skipped = slog.LevelWarn, n
		}
	}
	if !s.logger.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("request_id", string(id)), slog.String("method", string(ctx.Method())),
		slog.String("route", pattern), slog.Int("status", status), slog.Duration("took", took))
	if r.topic != "" {
		attrs = append(attrs, slog.String("topic", r.topic))
	}
	if r.group != "" {
		attrs = append(attrs, slog.String("group", r.group))
	}
	if k := ctx.Request.Header.Peek("Idempotency-Key"); len(k) > 0 && len(k) <= 256 {
		attrs = append(attrs, slog.String("idempotency_key", string(k)))
	}
	if h := ctx.Request.Header.Peek(forwardHeader); len(h) > 0 {
		attrs = append(attrs, slog.String("forwarded_hops", string(h)))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	if skipped > 0 {
		attrs = append(attrs, slog.Int("similar_not_logged", skipped))
	}
	s.logger.LogAttrs(context.Background(), level, "request", attrs...)
}

// loudEvery is how often a route's 5xx answers of one status are logged
// as warnings (the others in between are debug lines).
const loudEvery = 10 * time.Second

// loudLimiter spaces out the warnings of one route and status.
type loudLimiter struct {
	mu   sync.Mutex
	last map[loudKey]*loudState
}

type loudKey struct {
	route  string
	status int
}

type loudState struct {
	at      time.Time
	skipped int
}

// allow reports whether a warning for (route, status) may be logged now,
// and how many were held back since the last one.
func (l *loudLimiter) allow(route string, status int) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[loudKey]*loudState{}
	}
	k := loudKey{route, status}
	st := l.last[k]
	now := time.Now()
	if st != nil && now.Sub(st.at) < loudEvery {
		st.skipped++
		return false, 0
	}
	n := 0
	if st != nil {
		n = st.skipped
	}
	l.last[k] = &loudState{at: now}
	return true, n
}
