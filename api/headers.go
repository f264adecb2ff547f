package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// oneHeader returns the value of a header that may be given at most once:
// present reports whether it was given at all (possibly empty). A repeated
// header is refused, since which value counts would be a guess.
func oneHeader(h *fasthttp.RequestHeader, name string) (v []byte, present bool, err error) {
	all := h.PeekAll(name)
	switch len(all) {
	case 0:
		return nil, false, nil
	case 1:
		return all[0], true, nil
	}
	return nil, false, fmt.Errorf("%w: %s given %d times, send it once", ErrBadHeader, name, len(all))
}

// checkKey validates a key header or field: 1..256 bytes of valid UTF-8.
// The value is never echoed: it may hold anything.
func checkKey(name, v string) (string, error) {
	if len(v) < 1 || len(v) > maxKeyLen {
		return "", fmt.Errorf("%w: %s must be 1..%d bytes, got %d", ErrBadHeader, name, maxKeyLen, len(v))
	}
	if !utf8.ValidString(v) {
		return "", fmt.Errorf("%w: %s must be valid UTF-8", ErrBadHeader, name)
	}
	return v, nil
}

// parseError answers a request fasthttp could not read, or whose body it
// refused unread. fasthttp's own error texts can hold the raw header
// buffer (credentials included), so each class gets a fixed message and
// the original never reaches the client.
func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	defer s.budget.release(&ctx.Request.Header)
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case len(ctx.Request.Header.Peek(refusedHeader)) > 0:
		err = s.budget.errBudget()
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		err = fmt.Errorf("%w: body over %d bytes", ErrBodyTooLarge, maxBodyBytes)
	case errors.As(err, &small):
		err = fmt.Errorf("%w: request headers over %d bytes", ErrHeaderTooLarge, readBufferSize)
	case errors.As(err, &ne) && ne.Timeout():
		err = fmt.Errorf("%w: the request was not received in time", ErrRequestTimeout)
	default:
		err = fmt.Errorf("%w: malformed HTTP request", ErrBadRequest)
	}
	writeError(ctx, err)
	// Counted and logged like a routed answer: under its route's pattern
	// when the head is still there (a body refused unread), else as
	// "unparsed". fasthttp resets the head of a request it failed to read
	// (a bad head, a body cut short or late), so that raw headers remain
	// only when it refused the body from the head.
	var idBuf requestIDBuf
	id := requestID(ctx, idBuf[:0])
	ctx.Response.Header.SetBytesV(RequestIDHeader, id)
	r := &route{}
	pattern := "unparsed"
	if len(ctx.Request.Header.RawHeaders()) > 0 {
		pattern = "unmatched"
		if s.router.match(ctx.Method(), string(ctx.URI().PathOriginal()), r) == nil {
			pattern = r.def.Pattern
		}
	}
	s.metrics.countRequest(pattern, ctx.Response.StatusCode())
	s.logRequest(ctx, r, id, pattern, err, 0)
}

// fasthttpLogger routes fasthttp's own log lines through slog. With
// Server.SecureErrorLogMessage set, fasthttp leaves request contents out of
// them.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Warn("http server", "detail", fmt.Sprintf(format, args...))
}
