package raftfsm

import "github.com/mqd/mqd/replica"

// ErrStateBehindLog: at start, neither the state nor a snapshot reaches
// back to the first entry of the raft log (replica.ErrStateBehindLog).
var ErrStateBehindLog = replica.ErrStateBehindLog
