package replica

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// gatePair is two raft TCP transports on 127.0.0.1, the second behind a
// VoteGate whose restriction the test sets.
func gatePair(t *testing.T) (a *raft.NetworkTransport, b *VoteGate, restricted, diverged *atomic.Bool) {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	a, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	inner, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, logger)
	if err != nil {
		t.Fatal(err)
	}
	restricted, diverged = &atomic.Bool{}, &atomic.Bool{}
	b = NewVoteGate(inner, "b", restricted.Load, diverged.Load, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { b.Close() })
	return a, b, restricted, diverged
}

// serve answers every RPC on ch as raft would grant it, and sends the
// command it saw on seen.
func serve(ch <-chan raft.RPC, seen chan<- any, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case rpc := <-ch:
			seen <- rpc.Command
			switch rpc.Command.(type) {
			case *raft.RequestVoteRequest:
				rpc.Respond(&raft.RequestVoteResponse{Term: 7, Granted: true}, nil)
			case *raft.RequestPreVoteRequest:
				rpc.Respond(&raft.RequestPreVoteResponse{Term: 7, Granted: true}, nil)
			case *raft.AppendEntriesRequest:
				rpc.Respond(&raft.AppendEntriesResponse{Term: 7, Success: true}, nil)
			case *raft.TimeoutNowRequest:
				rpc.Respond(&raft.TimeoutNowResponse{}, nil)
			case *raft.InstallSnapshotRequest:
				_, _ = io.Copy(io.Discard, rpc.Reader)
				rpc.Respond(&raft.InstallSnapshotResponse{Term: 7, Success: true}, nil)
			}
		}
	}
}

// TestVoteGateRefusesVotesWhileRestricted: while restricted, vote and
// pre-vote requests to the gated node are answered not granted at the
// candidate's term and never reach its raft, TimeoutNow is refused, and
// AppendEntries still passes; its own vote requests are not sent. Once
// lifted, everything passes.
func TestVoteGateRefusesVotesWhileRestricted(t *testing.T) {
	a, b, restricted, _ := gatePair(t)
	done := make(chan struct{})
	defer close(done)
	seenB, seenA := make(chan any, 16), make(chan any, 16)
	go serve(b.Consumer(), seenB, done)
	go serve(a.Consumer(), seenA, done)
	bAddr, aAddr := b.LocalAddr(), a.LocalAddr()
	vote := &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}, Term: 5}
	pre := &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}, Term: 5}
	appendReq := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}, Term: 5}

	restricted.Store(true)
	var vr raft.RequestVoteResponse
	if err := a.RequestVote("b", bAddr, vote, &vr); err != nil || vr.Granted || vr.Term != 5 {
		t.Fatalf("vote while restricted: %+v, %v; want not granted at term 5", vr, err)
	}
	var pr raft.RequestPreVoteResponse
	if err := a.RequestPreVote("b", bAddr, pre, &pr); err != nil || pr.Granted || pr.Term != 5 {
		t.Fatalf("pre-vote while restricted: %+v, %v; want not granted at term 5", pr, err)
	}
	if err := a.TimeoutNow("b", bAddr, &raft.TimeoutNowRequest{}, &raft.TimeoutNowResponse{}); err == nil || !strings.Contains(err.Error(), "not standing for election") {
		t.Fatalf("TimeoutNow while restricted: %v", err)
	}
	var ar raft.AppendEntriesResponse
	if err := a.AppendEntries("b", bAddr, appendReq, &ar); err != nil || !ar.Success {
		t.Fatalf("append while restricted: %+v, %v", ar, err)
	}
	// The first RPC b's raft saw is the append: the votes never reached it.
	if got := <-seenB; !isAppend(got) {
		t.Fatalf("b's raft first saw %T, want the AppendEntries", got)
	}
	// b's own requests are not sent: a's raft first sees b's append.
	if err := b.RequestVote("a", aAddr, vote, &vr); err != nil || vr.Granted {
		t.Fatalf("b's vote request while restricted: %+v, %v", vr, err)
	}
	if err := b.RequestPreVote("a", aAddr, pre, &pr); err != nil || pr.Granted {
		t.Fatalf("b's pre-vote request while restricted: %+v, %v", pr, err)
	}
	if err := b.AppendEntries("a", aAddr, appendReq, &ar); err != nil || !ar.Success {
		t.Fatalf("b's append: %+v, %v", ar, err)
	}
	if got := <-seenA; !isAppend(got) {
		t.Fatalf("a's raft first saw %T, want the AppendEntries", got)
	}

	restricted.Store(false)
	if err := a.RequestVote("b", bAddr, vote, &vr); err != nil || !vr.Granted {
		t.Fatalf("vote once lifted: %+v, %v", vr, err)
	}
	if _, ok := (<-seenB).(*raft.RequestVoteRequest); !ok {
		t.Fatal("b's raft did not see the vote request once lifted")
	}
	if err := b.RequestPreVote("a", aAddr, pre, &pr); err != nil || !pr.Granted {
		t.Fatalf("b's pre-vote once lifted: %+v, %v", pr, err)
	}
}

func isAppend(c any) bool {
	_, ok := c.(*raft.AppendEntriesRequest)
	return ok
}

// TestVoteGateKeepsDivergedState: a node restricted for good refuses the
// leader's snapshot (it would replace the only state holding what the
// cluster lost), reading its bytes so that the connection stays usable;
// a node restricted until caught up takes it.
func TestVoteGateKeepsDivergedState(t *testing.T) {
	a, b, restricted, diverged := gatePair(t)
	done := make(chan struct{})
	defer close(done)
	seen := make(chan any, 16)
	go serve(b.Consumer(), seen, done)
	snap := &raft.InstallSnapshotRequest{RPCHeader: raft.RPCHeader{ID: []byte("a")}, Term: 5, Size: 8 << 20}
	data := bytes.Repeat([]byte("s"), 8<<20) // more than socket buffers hold
	restricted.Store(true)
	diverged.Store(true)
	var sr raft.InstallSnapshotResponse
	if err := a.InstallSnapshot("b", b.LocalAddr(), snap, &sr, bytes.NewReader(data)); err == nil || !strings.Contains(err.Error(), "kept as it is") {
		t.Fatalf("snapshot to a diverged node: %+v, %v; want refused", sr, err)
	}
	var ar raft.AppendEntriesResponse
	if err := a.AppendEntries("b", b.LocalAddr(), &raft.AppendEntriesRequest{Term: 5}, &ar); err != nil || !ar.Success {
		t.Fatalf("append after the refused snapshot: %+v, %v", ar, err)
	}
	if got := <-seen; !isAppend(got) {
		t.Fatalf("b's raft first saw %T, want the AppendEntries", got)
	}
	diverged.Store(false)
	if err := a.InstallSnapshot("b", b.LocalAddr(), snap, &sr, bytes.NewReader(data)); err != nil || !sr.Success {
		t.Fatalf("snapshot to a node restricted until caught up: %+v, %v", sr, err)
	}
	if _, ok := (<-seen).(*raft.InstallSnapshotRequest); !ok {
		t.Fatal("b's raft did not see the snapshot")
	}
}
