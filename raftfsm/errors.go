package raftfsm

import (
	"errors"
)

// Sentinel errors of the node.
var (
	ErrNotLeader = errors.New("not the leader")
	ErrNoQuorum  = errors.New("no quorum: the write could not be committed in time")
	ErrShutdown  = errors.New("node is shutting down")
	// ErrStateBehindLog: at start, neither the state nor a snapshot
	// reaches back to the first entry of the raft log.
	ErrStateBehindLog = errors.New("state behind the raft log")
)
