package raftfsm

import "errors"

// ErrStateBehindLog: at start, neither the state nor a snapshot reaches
// back to the first entry of the raft log.
var ErrStateBehindLog = errors.New("state behind the raft log")
