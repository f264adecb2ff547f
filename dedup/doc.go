// Package dedup is mqd's idempotency machinery, stored in bbolt: the
// publish index of idempotency keys, producer sequences, and the keys each
// consumer group has processed. Every entry has an expiry time and a place
// in one time-ordered expiry index, so expiry walks only what is due.
//
// It works inside transactions the caller owns and never reads the clock.
// It does not decide what a duplicate answers; the state machine does.
package dedup
