// Package refusal is the one catalogue of refusals: requests the broker
// turns down for a reason of the request or the state (unknown topic, full
// topic, producer sequence gap, ...), not because something failed. A
// refusal is raised where it is decided, as an *Error carrying its HTTP
// status and stable code. The state machine answers a refused command with
// the refusal instead of stopping the node (a refusal is detected before
// the command writes anything), and the HTTP layer answers its status and
// code: both decisions come from the type, so there is no list to keep in
// step. It is not for failures (storage, quorum, shutdown).
package refusal

import (
	"errors"
	"sync"
)

// Error is a refusal. Compare with errors.Is against the package-level
// values made by New.
type Error struct {
	Status int    // HTTP status
	Code   string // stable machine-readable code
	msg    string
}

func (e *Error) Error() string { return e.msg }

var (
	mu  sync.Mutex
	all []*Error
)

// New makes and records a refusal; call it once per kind, in a package
// variable.
func New(status int, code, msg string) *Error {
	e := &Error{Status: status, Code: code, msg: msg}
	mu.Lock()
	all = append(all, e)
	mu.Unlock()
	return e
}

// As returns the refusal err wraps, if any.
func As(err error) (*Error, bool) {
	var r *Error
	ok := errors.As(err, &r)
	return r, ok
}

// Is reports whether err wraps a refusal.
func Is(err error) bool {
	_, ok := As(err)
	return ok
}

// All is every refusal made so far (by the packages initialised before the
// caller), in the order they were made.
func All() []*Error {
	mu.Lock()
	defer mu.Unlock()
	return append([]*Error(nil), all...)
}
