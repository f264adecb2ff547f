package replica

import (
	"sync"

	"github.com/hashicorp/raft"
)

// drainedPipeline is raft's AppendEntries pipeline with its answers always
// read off the connection, whether raft still reads them or not.
//
// hashicorp/raft v1.8.0 can deadlock a leader's replication to one follower
// for good (hashicorp/raft issue 612): the network transport's pipeline
// hands each decoded answer over an unbuffered channel (MaxRPCsInFlight 2,
// the default, sizes both of its channels at 0), and raft's reader of those
// answers (pipelineDecode) returns on the first failed one, for example a
// follower that has to be sent a snapshot. The replication loop may still
// send one more request before it notices; that send waits for the decoder
// to take it, the decoder waits for raft to take the previous answer, and
// the pipeline's Close, which would free both, is deferred behind the send.
// Heartbeats go on (they have their own loop), so the follower never holds
// an election either: it simply receives no entry again until the leader
// restarts. (Found while looking for why TestCatchUpBoundedMemory's wiped
// follower sometimes never catches up; that hang has another cause too,
// docs/reliability.md.)
//
// Here one goroutine moves every answer from the transport's pipeline into
// a queue and offers the queue's head to raft, so the transport's decoder
// never waits for raft. The queue holds only the answers raft stopped
// reading: after its reader returns raft sends at most the requests
// already under way before it closes the pipeline, and Close ends the
// goroutine.
type drainedPipeline struct {
	raft.AppendPipeline
	out       chan raft.AppendFuture
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

func drainPipeline(p raft.AppendPipeline) *drainedPipeline {
	d := &drainedPipeline{AppendPipeline: p, out: make(chan raft.AppendFuture), done: make(chan struct{})}
	d.wg.Add(1)
	go d.relay()
	return d
}

func (d *drainedPipeline) relay() {
	defer d.wg.Done()
	in := d.AppendPipeline.Consumer()
	var queue []raft.AppendFuture
	for {
		var out chan raft.AppendFuture // nil (never ready) while the queue is empty
		var head raft.AppendFuture
		if len(queue) > 0 {
			out, head = d.out, queue[0]
		}
		select {
		case f := <-in:
			queue = append(queue, f)
		case out <- head:
			queue[0] = nil
			queue = queue[1:]
		case <-d.done:
			return
		}
	}
}

// Consumer is the channel raft reads the pipeline's answers from.
func (d *drainedPipeline) Consumer() <-chan raft.AppendFuture { return d.out }

// Close ends the relay and closes the transport's pipeline (which releases
// its connection and its decoder).
func (d *drainedPipeline) Close() error {
	d.closeOnce.Do(func() { close(d.done) })
	err := d.AppendPipeline.Close()
	d.wg.Wait()
	return err
}
