package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Handler processes one message. Returning nil acks it; returning an error
// nacks it with the error's text as the reason (retried after the backoff),
// or, for an error made with Reject, sends it to the dead-letter store. ctx
// ends when Consume's context ends or the message's lease is lost.
type Handler func(ctx context.Context, m *Message) error

// ErrRejected marks a handler error as final (see Reject).
var ErrRejected = errors.New("rejected")

// ErrLeaseLost is the cause of a handler's context ending because extending
// its lease answered stale or invalid: the message may be with another
// consumer now, and the handler's outcome will not count.
var ErrLeaseLost = errors.New("lease lost")

// Reject wraps err so that a Handler returning it nacks the message as not
// retryable: it goes to the dead-letter store at once.
func Reject(err error) error { return fmt.Errorf("%w: %w", ErrRejected, err) }

// ConsumeOptions tune Consume. Zero values take the defaults.
type ConsumeOptions struct {
	Max         int           // messages per fetch (default Concurrency)
	Wait        time.Duration // long poll per fetch (default 10 s)
	Lease       time.Duration // lease per message, extended every third of it while the handler runs (default 30 s)
	Concurrency int           // handlers running at once (default 1)
	// OnError, when set, hears of what Consume carries on after: fetches
	// that failed and will be retried, failed acks/nacks/extends, and
	// receipts answered stale or invalid.
	OnError func(error)
}

// Consume fetches from topic for group and runs h on each message until ctx
// ends (then it returns nil, once the running handlers have finished and
// their messages are acked or nacked) or a fetch fails with an error that
// retrying cannot fix (returned: topic_not_found, forbidden, ...).
func (c *Client) Consume(ctx context.Context, topic, group string, h Handler, o ConsumeOptions) error {
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.Max <= 0 {
		o.Max = o.Concurrency
	}
	if o.Wait <= 0 {
		o.Wait = 10 * time.Second
	}
	if o.Lease <= 0 {
		o.Lease = 30 * time.Second
	}
	report := func(err error) {
		if o.OnError != nil {
			o.OnError(err)
		}
	}
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	backoff := c.backoff
	for ctx.Err() == nil {
		// Fetch only as many as there are free handler slots, so that no
		// message waits leased while its lease runs out unextended.
		sem <- struct{}{}
		free := 1
		for free < o.Max && len(sem) < cap(sem) {
			sem <- struct{}{}
			free++
		}
		msgs, err := c.Fetch(ctx, topic, group, FetchOptions{Max: free, Wait: o.Wait, Lease: o.Lease})
		for range free - len(msgs) {
			<-sem
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !IsRetryable(err) {
				return err
			}
			report(fmt.Errorf("fetch (retrying): %w", err))
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, maxRetryBackoff)
			continue
		}
		backoff = c.backoff
		for i := range msgs {
			m := &msgs[i]
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				c.handle(ctx, topic, group, m, h, o.Lease, report)
			}()
		}
	}
	return nil
}

// handle runs h on m with its lease kept alive, then acks or nacks m.
func (c *Client) handle(ctx context.Context, topic, group string, m *Message, h Handler, lease time.Duration, report func(error)) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.keepLease(hctx, stop, topic, group, m.Receipt, lease, cancel, report)
	}()
	herr := h(hctx, m)
	close(stop)
	wg.Wait()
	if errors.Is(context.Cause(hctx), ErrLeaseLost) || errors.Is(herr, errSettled) {
		return // already reported, or settled by a process call (process.go)
	}
	// Settle even when ctx has ended: the handler's work is done.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer scancel()
	var res []ReceiptResult
	var err error
	if herr == nil {
		res, err = c.Ack(sctx, topic, group, m.Receipt)
	} else {
		reason := herr.Error()
		if broken(breakNackNoReason) {
			reason = ""
		}
		res, err = c.Nack(sctx, topic, group, NackOptions{Reason: reason, NotRetryable: errors.Is(herr, ErrRejected)}, m.Receipt)
	}
	switch {
	case err != nil:
		report(fmt.Errorf("settling %s/%d@%d: %w", m.Topic, m.Partition, m.Offset, err))
	case len(res) == 1 && res[0].Status != StatusOK:
		report(fmt.Errorf("settling %s/%d@%d: receipt %s", m.Topic, m.Partition, m.Offset, res[0].Status))
	}
}

// keepLease extends the lease every third of its length until stop closes;
// a lease found lost cancels the handler's context with ErrLeaseLost.
func (c *Client) keepLease(ctx context.Context, stop <-chan struct{}, topic, group, receipt string, lease time.Duration,
	cancel context.CancelCauseFunc, report func(error)) {
	if broken(breakNoExtend) {
		return
	}
	t := time.NewTicker(max(lease/3, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := c.Extend(ctx, topic, group, lease, receipt)
		if err != nil {
			if ctx.Err() != nil {
				return // stopping: not a failure to report
			}
			report(fmt.Errorf("extending lease: %w", err))
			continue
		}
		if len(res) == 1 && res[0].Status != StatusOK {
			report(fmt.Errorf("extending lease: receipt %s: %w", res[0].Status, ErrLeaseLost))
			cancel(ErrLeaseLost)
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
