package raftfsm

import "errors"

// Sentinel errors of the node and the state machine.
var (
	ErrNotLeader = errors.New("not the leader")
	ErrNoQuorum  = errors.New("no quorum: the write could not be committed in time")
	ErrShutdown  = errors.New("node is shutting down")
	ErrSeqGap    = errors.New("producer sequence gap")
	ErrSeqTooOld = errors.New("producer sequence older than the kept history")
	// ErrSeqOverlap: a batch starts at a stored sequence but runs past the
	// last stored one (a partial repeat).
	ErrSeqOverlap = errors.New("producer sequence overlap")
)
