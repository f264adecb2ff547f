package replica

import (
	"io"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// TestPipelineDoesNotDeadlockWhenAnswersAreNotRead is raft's replication
// after its answer reader returned (a follower that refused an entry): the
// leader reads one answer, then only sends. With the transport's own
// pipeline the third send waits for ever (the decoder holds the second
// answer for a reader that is gone); through the VoteGate every send must
// return, and closing the pipeline must not hang.
func TestPipelineDoesNotDeadlockWhenAnswersAreNotRead(t *testing.T) {
	follower, leader, _, _ := gatePair(t)
	// A follower whose log does not match: every append refused.
	answer(t, follower, func(*raft.AppendEntriesRequest) *raft.AppendEntriesResponse {
		return &raft.AppendEntriesResponse{Term: 7, Success: false, LastLog: 3}
	})

	p, err := leader.AppendEntriesPipeline("a", follower.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	send := func(i int) {
		t.Helper()
		sent := make(chan error, 1)
		go func() {
			_, err := p.AppendEntries(&raft.AppendEntriesRequest{Term: 7, PrevLogEntry: uint64(i)}, &raft.AppendEntriesResponse{})
			sent <- err
		}()
		select {
		case err := <-sent:
			if err != nil {
				t.Fatalf("append %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("append %d still waiting after 10 s: the pipeline's answers are not drained", i)
		}
	}

	send(1)
	select {
	case f := <-p.Consumer():
		if f.Response().Success {
			t.Fatalf("answer 1 = success, want the follower's refusal")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to append 1")
	}
	// raft's reader is gone from here on: nothing reads p.Consumer().
	for i := 2; i <= 6; i++ {
		send(i)
	}

	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the pipeline hangs")
	}
}

// TestPipelineRelaysAnswersInOrder: with a reader, every answer reaches it
// once and in the order of the requests.
func TestPipelineRelaysAnswersInOrder(t *testing.T) {
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	follower, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	_, leader, _, _ := gatePair(t)
	answer(t, follower, func(req *raft.AppendEntriesRequest) *raft.AppendEntriesResponse {
		return &raft.AppendEntriesResponse{Term: 7, Success: true, LastLog: req.PrevLogEntry}
	})
	p, err := leader.AppendEntriesPipeline("f", follower.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 200
	go func() {
		for i := 1; i <= n; i++ {
			if _, err := p.AppendEntries(&raft.AppendEntriesRequest{Term: 7, PrevLogEntry: uint64(i)}, &raft.AppendEntriesResponse{}); err != nil {
				return
			}
		}
	}()
	for i := 1; i <= n; i++ {
		select {
		case f := <-p.Consumer():
			if got := f.Response().LastLog; got != uint64(i) {
				t.Fatalf("answer %d is for request %d", i, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("answer %d missing", i)
		}
	}
}

// answer responds to every AppendEntries the transport receives with
// what fn says, until the test ends.
func answer(t *testing.T, tr raft.Transport, fn func(*raft.AppendEntriesRequest) *raft.AppendEntriesResponse) {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case <-done:
				return
			case rpc := <-tr.Consumer():
				rpc.Respond(fn(rpc.Command.(*raft.AppendEntriesRequest)), nil)
			}
		}
	}()
}
