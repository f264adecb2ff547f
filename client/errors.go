package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error is an error answer of the broker: its HTTP status and the stable
// code and message of its JSON body {"error":{"code","message"}}.
type Error struct {
	Status     int
	Code       string // stable, snake_case, e.g. "topic_not_found"
	Message    string // for people
	RetryAfter time.Duration
	Method     string
	Path       string
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Message)
	}
	return fmt.Sprintf("%s (%s, HTTP %d)", e.Message, e.Code, e.Status)
}

// Retryable reports whether the same request may succeed later unchanged:
// 503 (no quorum, no leader, shutting down, unavailable) and 429.
func (e *Error) Retryable() bool {
	return e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests
}

// ErrNoNodes is returned by New for an empty node list.
var ErrNoNodes = errors.New("client: no server given")

// IsCode reports whether err is (or wraps) an *Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsRetryable reports whether err is worth retrying with the same request
// (and, for a publish, the same Idempotency-Key): a retryable *Error, or no
// answer at all (a transport error or a timeout).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable()
	}
	var te *TransportError
	return errors.As(err, &te)
}

// TransportError is a request that got no answer: refused, reset, timed out.
// Sent tells whether the request may have reached the node (and so may have
// taken effect).
type TransportError struct {
	Node string
	Sent bool
	Err  error
}

func (e *TransportError) Error() string { return fmt.Sprintf("%s: %v", e.Node, e.Err) }
func (e *TransportError) Unwrap() error { return e.Err }
