package replica

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// Group commit above Raft: concurrent publishes, fetches (leases), acks,
// extends and nacks are gathered into one OpMulti log entry, so that many
// requests share one log append, one fsync per node and one FSM
// transaction, and the per-entry costs of Raft are paid once per batch
// instead of once per request.

const (
	maxBatchCmds  = 512
	maxBatchBytes = 4 << 20
	// batchPipeline is how many batches may be in flight in Raft at once.
	// One: while it is being committed the next one fills with everything
	// that arrives meanwhile. Measured with 3 nodes, side by side
	// (-bench 'Publish$'): 16 publishers 4187/4175 msg/s at depth 1 against
	// 3706/3649 at depth 2, 64 publishers 9839/8613 against 8864/9085; a
	// second entry in flight only splits the same requests into two
	// entries, each paying the per-entry costs (fsyncs, bbolt commits).
	batchPipeline = 1
)

type pending struct {
	enc    []byte  // the encoded command
	buf    *[]byte // enc's buffer from encBufs, or nil
	queued time.Time
	done   chan batchResult
	// rest, on the first command of a group (SubmitAll), are the others:
	// they enter the batch with it, in order.
	rest []*pending
}

type batchResult struct {
	res *fsm.Result
	err error
}

// Batcher is the group commit of one replica's leader.
type Batcher struct {
	// propose hands one entry to raft (ErrNotLeader when not leading).
	propose func(ctx context.Context, data []byte) (raft.ApplyFuture, error)
	in      chan *pending
	slots   chan struct{}

	// Exposed on /metrics: how full the entries are, how long a command
	// waits for its entry to close, and how long an entry takes in Raft
	// (append on a majority, commit, apply here).
	size  prometheus.Histogram
	queue prometheus.Histogram
	raft  prometheus.Histogram
}

// NewBatcher returns a group commit proposing through propose; Run runs it.
// Its metrics carry labels (the group's id).
func NewBatcher(propose func(ctx context.Context, data []byte) (raft.ApplyFuture, error), labels prometheus.Labels) *Batcher {
	return &Batcher{propose: propose, in: make(chan *pending, maxBatchCmds), slots: make(chan struct{}, batchPipeline),
		size: prometheus.NewHistogram(prometheus.HistogramOpts{ConstLabels: labels, Name: "mqd_batch_commands",
			Help:    "Commands (publishes, leases, acks, extends, nacks) per group commit (one raft append) on the leader.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		queue: prometheus.NewHistogram(prometheus.HistogramOpts{ConstLabels: labels, Name: "mqd_batch_queue_seconds",
			Help:    "Time a command waits for its group-committed entry to be proposed.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}),
		raft: prometheus.NewHistogram(prometheus.HistogramOpts{ConstLabels: labels, Name: "mqd_batch_raft_seconds",
			Help:    "Time from proposing a group commit to its commit and apply on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}),
	}
}

// Submit hands an encoded command (and its pooled buffer, or nil) to the
// group commit and waits for its own result, or for ctx to end.
func (b *Batcher) Submit(ctx context.Context, enc []byte, buf *[]byte) (*fsm.Result, error) {
	p := &pending{enc: enc, buf: buf, queued: time.Now(), done: make(chan batchResult, 1)}
	select {
	case b.in <- p:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
	return Queued{p}.Wait(ctx)
}

// SubmitAll hands encoded commands (and their pooled buffers, or nils)
// to the group commit together: they go into one batch, never split over
// two (a batch may then hold more than maxBatchCmds commands), so that
// they commit together and none waits a round for another's entry. It
// returns once they are queued, or with ctx's error when ctx ends first
// (nothing was queued); each result is then waited for with Queued.Wait.
func (b *Batcher) SubmitAll(ctx context.Context, encs [][]byte, bufs []*[]byte) ([]Queued, error) {
	if len(encs) == 0 {
		return nil, nil
	}
	now := time.Now()
	ps := make([]pending, len(encs))
	qs := make([]Queued, len(encs))
	rest := make([]*pending, 0, len(encs)-1)
	for i := range ps {
		ps[i] = pending{enc: encs[i], buf: bufs[i], queued: now, done: make(chan batchResult, 1)}
		qs[i] = Queued{&ps[i]}
		if i > 0 {
			rest = append(rest, &ps[i])
		}
	}
	ps[0].rest = rest
	select {
	case b.in <- &ps[0]:
		return qs, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
}

// Queued is a command submitted with others (SubmitAll).
type Queued struct{ p *pending }

// Wait waits for the command's result, or for ctx to end (the command may
// still be committed).
func (q Queued) Wait(ctx context.Context) (*fsm.Result, error) {
	select {
	case r := <-q.p.done:
		return r.res, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
	}
}

// Collectors are the batcher's histograms, for /metrics.
func (b *Batcher) Collectors() []prometheus.Collector {
	return []prometheus.Collector{b.size, b.queue, b.raft}
}

// Run gathers commands into batches until ctx ends. A batch is closed only
// once a pipeline slot is free, so that everything that arrived while the
// pipeline was full goes into the next entry together (closing it earlier
// would send a nearly empty entry and make the rest wait a whole round).
func (b *Batcher) Run(ctx context.Context) {
	defer b.drain()
	for {
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var first *pending
		select {
		case <-ctx.Done():
			return
		case first = <-b.in:
		}
		batch, size := take(nil, 0, first)
	fill:
		for len(batch) < maxBatchCmds && size < maxBatchBytes {
			select {
			case p := <-b.in:
				batch, size = take(batch, size, p)
			default:
				break fill
			}
		}
		go b.commit(batch)
	}
}

// take appends p and the rest of its group to batch, whose commands'
// encodings are size bytes.
func take(batch []*pending, size int, p *pending) ([]*pending, int) {
	batch = append(batch, p)
	size += len(p.enc)
	for _, q := range p.rest {
		batch = append(batch, q)
		size += len(q.enc)
	}
	p.rest = nil
	return batch, size
}

func (b *Batcher) commit(batch []*pending) {
	defer func() { <-b.slots }()
	start := time.Now()
	b.size.Observe(float64(len(batch)))
	for _, p := range batch {
		b.queue.Observe(start.Sub(p.queued).Seconds())
	}
	defer func() { b.raft.Observe(time.Since(start).Seconds()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries := packEntries(batch)
	recycleCopied(batch, entries)
	// All entries go to Raft at once: its leader loop appends them in one
	// log transaction and sends them in one AppendEntries, and the FSM
	// applies them in one bbolt transaction.
	futures := make([]raft.ApplyFuture, len(entries))
	for i, e := range entries {
		f, err := b.propose(ctx, e.data)
		if err != nil {
			for _, e := range entries[i:] {
				fail(batch[e.first:e.first+e.n], err)
			}
			entries = entries[:i]
			break
		}
		futures[i] = f
	}
	for i, e := range entries {
		res, err := Await(ctx, futures[i])
		part := batch[e.first : e.first+e.n]
		switch {
		case e.n == 1:
			part[0].done <- batchResult{res, err}
		case err != nil:
			fail(part, err)
		default:
			for j, p := range part {
				r := res.Multi[j]
				p.done <- batchResult{r, r.Err}
			}
		}
	}
}

// entryBytes is the size up to which commands share one raft log entry;
// a group commit above it is proposed as several entries, which Raft still
// appends in one log transaction and one AppendEntries. raft-boltdb keeps
// the log in a bbolt B+tree that rewrites its last leaf, at least two
// entries, on every append: one 400 KiB entry per append writes the
// previous one again, before the fsync that every answer waits for.
// Measured: appending groups of 30 publishes of 1 KiB wrote 10.1x the
// payload as one entry per group, 2.8-3.5x as entries of 3-7 KiB (but the
// per-entry costs made publishing slower end to end); with 64 KiB, small
// publishes keep one entry per commit and batch publishes (100 x 1 KiB
// each) get one entry each: BenchmarkPublishBatch 52.6k/52.0k against
// 47.0k/45.7k msgs/s with one entry per commit.
const entryBytes = 64 << 10

// MaxAppendEntries bounds the entries raft sends a follower in one
// AppendEntries (raftfsm/node.go): with entryBytes, about 4 MiB of batched commands.
const MaxAppendEntries = 64

type entry struct {
	first, n int // batch[first : first+n]
	data     []byte
}

// packEntries encodes the batch's commands into entries of at most about
// entryBytes each (a larger command is an entry of its own), keeping their
// order; an entry of several commands is an OpMulti.
func packEntries(batch []*pending) []entry {
	var out []entry
	var subs [][]byte
	size, first := 0, 0
	flush := func(end int) {
		if end == first {
			return
		}
		e := entry{first: first, n: end - first}
		if e.n == 1 {
			e.data = subs[0]
		} else {
			e.data = command.EncodeMulti(0, subs)
		}
		out = append(out, e)
		subs, size, first = subs[:0], 0, end
	}
	for i, p := range batch {
		enc := p.enc
		if len(subs) > 0 && size+len(enc) > entryBytes {
			flush(i)
		}
		subs = append(subs, enc)
		size += len(enc) + binary.MaxVarintLen32
	}
	flush(len(batch))
	return out
}

// recycleCopied gives back to encBufs the encodings that packEntries copied
// into an OpMulti entry. A command alone in its entry is that entry's data,
// which raft keeps: it is not given back.
func recycleCopied(batch []*pending, entries []entry) {
	for _, e := range entries {
		if e.n == 1 {
			continue
		}
		for _, p := range batch[e.first : e.first+e.n] {
			command.RecycleEnc(p.buf)
			p.enc, p.buf = nil, nil
		}
	}
}

// drain answers what is still queued when the batcher stops: nothing of
// it was proposed.
func (b *Batcher) drain() {
	for {
		select {
		case p := <-b.in:
			batch, _ := take(nil, 0, p)
			fail(batch, ErrShutdown)
		default:
			return
		}
	}
}

func fail(batch []*pending, err error) {
	for _, p := range batch {
		p.done <- batchResult{nil, err}
	}
}
