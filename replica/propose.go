package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/fsm"
)

// Propose hands an encoded command to r without waiting for it: the
// future answers once it is committed and applied here. ctx's deadline
// bounds raft's enqueue (10 s without one).
func Propose(ctx context.Context, r *raft.Raft, data []byte) (raft.ApplyFuture, error) {
	if r.State() != raft.Leader {
		return nil, ErrNotLeader
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
		if timeout <= 0 {
			return nil, ErrNoQuorum
		}
	}
	return r.Apply(data, timeout), nil
}

// Await waits for a proposed command to be committed and applied here, or
// for ctx to end.
func Await(ctx context.Context, f raft.ApplyFuture) (*fsm.Result, error) {
	done := make(chan struct{})
	go func() { _ = f.Error(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader) || IsTransferring(err):
			return nil, ErrNotLeader
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, ErrShutdown
		default: // leadership lost, enqueue timeout
			return nil, fmt.Errorf("%w: %w", ErrNoQuorum, err)
		}
	}
	res, _ := f.Response().(*fsm.Result)
	if res == nil {
		return nil, fmt.Errorf("%w: no result", ErrNoQuorum)
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// IsTransferring is raft's refusal of a proposal during a leadership
// transfer: nothing was appended.
func IsTransferring(err error) bool { return errors.Is(err, raft.ErrLeadershipTransferInProgress) }
