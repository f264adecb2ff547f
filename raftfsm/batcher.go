package raftfsm

import (
	"context"
	"fmt"
	"time"
)

// Group commit above Raft: concurrent publishes, acks and extends are
// gathered into one OpMulti log entry, so that many requests share one
// log append, one fsync per node and one FSM transaction, and the per-entry
// costs of Raft are paid once per batch instead of once per request.

const (
	maxBatchCmds  = 512
	maxBatchBytes = 4 << 20
	// batchPipeline is how many batches may be in flight in Raft at once:
	// while one is being committed, the next one fills. Measured with 64
	// publishers on a 3-node cluster: 1 → 8.4k msg/s, 2 → 9.0k, 4 → 7.1k
	// (deeper pipelines split the same requests into smaller batches).
	batchPipeline = 2
)

type pending struct {
	cmd  *Command
	size int
	done chan batchResult
}

type batchResult struct {
	res *Result
	err error
}

type batcher struct {
	n     *Node
	in    chan *pending
	slots chan struct{}
}

func newBatcher(n *Node) *batcher {
	return &batcher{n: n, in: make(chan *pending, maxBatchCmds), slots: make(chan struct{}, batchPipeline)}
}

// ApplyBatched is Apply for commands that may share a log entry with
// others (each is applied on its own; one's failure does not fail another).
func (n *Node) ApplyBatched(ctx context.Context, c *Command) (*Result, error) {
	if !n.IsLeader() {
		return nil, ErrNotLeader
	}
	p := &pending{cmd: c, size: approxSize(c), done: make(chan batchResult, 1)}
	select {
	case n.batch.in <- p:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
	select {
	case r := <-p.done:
		return r.res, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
}

func approxSize(c *Command) int {
	n := 64
	for _, m := range c.Msgs {
		n += len(m.Msg.Value) + len(m.Msg.IdempotencyKey) + 32
	}
	return n + 24*len(c.Receipts)
}

// run gathers commands into batches until ctx ends.
func (b *batcher) run(ctx context.Context) {
	for {
		var first *pending
		select {
		case <-ctx.Done():
			return
		case first = <-b.in:
		}
		batch := []*pending{first}
		size := first.size
	fill:
		for len(batch) < maxBatchCmds && size < maxBatchBytes {
			select {
			case p := <-b.in:
				batch = append(batch, p)
				size += p.size
			default:
				break fill
			}
		}
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			fail(batch, ErrShutdown)
			return
		}
		go b.commit(batch)
	}
}

func (b *batcher) commit(batch []*pending) {
	defer func() { <-b.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(batch) == 1 {
		res, err := b.n.Apply(ctx, batch[0].cmd)
		batch[0].done <- batchResult{res, err}
		return
	}
	multi := &Command{Op: OpMulti, Batch: make([]*Command, len(batch))}
	for i, p := range batch {
		multi.Batch[i] = p.cmd
	}
	res, err := b.n.Apply(ctx, multi)
	if err != nil {
		fail(batch, err)
		return
	}
	for i, p := range batch {
		r := res.Multi[i]
		p.done <- batchResult{r, r.Err}
	}
}

func fail(batch []*pending, err error) {
	for _, p := range batch {
		p.done <- batchResult{nil, err}
	}
}
