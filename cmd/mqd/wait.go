package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/mqd/mqd/client"
)

// defaultCLITimeout bounds a one-shot command (--timeout): above the
// broker's 10 s commit deadline, so a write's own 503 arrives first.
const defaultCLITimeout = 15 * time.Second

// waitNotice is how long a one-shot command runs before it says, on
// stderr, that it is still waiting.
const waitNotice = time.Second

// writeCommands change the cluster's state: an answer that never came
// may still have been committed.
var writeCommands = map[string]bool{
	"pub": true, "topic create": true, "topic delete": true,
	"dlq replay": true, "dlq delete": true, "cluster remove": true,
}

// bounded gives a one-shot command its --timeout and, once it has waited
// waitNotice, a line on stderr saying what it waits for; stop ends both.
func bounded(ctx context.Context, stderr io.Writer, name, server string, timeout time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTimer(waitNotice)
		defer t.Stop()
		select {
		case <-done:
		case <-ctx.Done():
		case <-t.C:
			what := "an answer"
			if writeCommands[name] {
				what = "the write to be committed"
			}
			fmt.Fprintf(stderr, "mqd: waiting for %s from %s (the cluster may have no leader; giving up after --timeout %s)...\n",
				what, server, timeout)
		}
	}()
	return ctx, func() { close(done); <-finished; cancel() }
}

// explainFailure adds what a person must know about a failed command:
// that it gave up at --timeout, and for a write without an answer or
// with a 503, that the write may still commit.
func explainFailure(stderr io.Writer, name string, timeout time.Duration, err error) {
	timedOut := errors.Is(err, context.DeadlineExceeded)
	if timedOut {
		fmt.Fprintf(stderr, "mqd: no answer within --timeout %s\n", timeout)
	}
	if !writeCommands[name] {
		return
	}
	var e *client.Error
	var te *client.TransportError
	if timedOut || (errors.As(err, &e) && e.Status == 503) || (errors.As(err, &te) && te.Sent) {
		fmt.Fprintln(stderr, "mqd: the write was not confirmed and may still commit; repeating it is safe for a publish with --key (the same idempotency key stores it once)")
	}
}
