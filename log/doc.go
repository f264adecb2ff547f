// Package log is mqd's partitioned message log, stored in bbolt: topics and
// their configuration, partitions, append, read by offset, and trimming from
// the head (retention and overflow).
//
// Every function works inside a bbolt transaction that the caller owns, so
// that the Raft state machine can apply a whole Raft batch in one
// transaction. The package never reads the clock: times come in as arguments.
// It knows nothing of consumer groups, leases or Raft.
//
// Import it under an alias (mlog) where the standard library's log is used.
package log
