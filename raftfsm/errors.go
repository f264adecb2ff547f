package raftfsm

import (
	"errors"

	"github.com/mqd/mqd/internal/refusal"
)

// Sentinel errors of the node and the state machine.
var (
	ErrNotLeader = errors.New("not the leader")
	ErrNoQuorum  = errors.New("no quorum: the write could not be committed in time")
	ErrShutdown  = errors.New("node is shutting down")
	// ErrStateBehindLog: at start, neither the state nor a snapshot
	// reaches back to the first entry of the raft log.
	ErrStateBehindLog = errors.New("state behind the raft log")
	// Refusals (package refusal): the FSM answers them, api maps them.
	ErrSeqGap    = refusal.New(409, "sequence_gap", "producer sequence gap")
	ErrSeqTooOld = refusal.New(409, "sequence_too_old", "producer sequence older than the kept history")
	// ErrSeqOverlap: a batch starts at a stored sequence but runs past the
	// last stored one (a partial repeat).
	ErrSeqOverlap = refusal.New(409, "sequence_overlap", "producer sequence overlap")
)
