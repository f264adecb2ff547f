package replica

import "errors"

// Sentinel errors of a replica's proposals.
var (
	ErrNotLeader = errors.New("not the leader")
	ErrNoQuorum  = errors.New("no quorum: the write could not be committed in time")
	ErrShutdown  = errors.New("node is shutting down")
)
