// Package dlq is mqd's dead-letter store, kept per consumer group in bbolt:
// each dead letter is a copy of the message with its final reject reason
// and its whole failure history, listed oldest first with paging and a
// filter by idempotency key, and queued for a rate-limited replay.
//
// It stores and finds dead letters; deciding when a message dies and
// putting a replayed one back into delivery is the group package's job.
// Like the other storage packages it works inside transactions the caller
// owns and never reads the clock.
package dlq
