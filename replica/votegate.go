package replica

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// GatedTransport is what VoteGate wraps: raft's TCP transport, with
// pre-vote and Close.
type GatedTransport interface {
	raft.Transport
	raft.WithPreVote
	raft.WithClose
}

// VoteGate is raft's transport as raft sees it. While restricted() holds
// (this node lost log entries it applied, lostlog.go) it keeps the node out
// of elections, both ways:
//
//   - RequestVote and RequestPreVote from a candidate are answered "not
//     granted" at the candidate's own term, without reaching raft, so the
//     node neither records a vote nor moves its term, and the candidate
//     counts a refusal (it steps down only on a higher term).
//   - This node's own RequestVote and RequestPreVote are answered "not
//     granted" without being sent. hashicorp/raft runs a pre-vote round
//     first (raft.go runCandidate), which does not persist or raise the
//     term, and starts the real election only on a majority of pre-votes;
//     so a restricted candidate never gets past the pre-vote and never
//     inflates its term. (A transport error would do the same, but raft
//     logs each one as an error, every election timeout.)
//   - TimeoutNow (a leader handing leadership to this node, which skips
//     the pre-vote) is refused with an error both ways.
//
// AppendEntries and InstallSnapshot pass, so the node keeps receiving the
// leader's log: that is how it catches up. Only a node restricted for good
// (diverged: the leader's log differs from what its state applied) refuses
// InstallSnapshot too: installing it would replace the one state that still
// holds the entries the cluster lost, which an operator may want back. Every RPC passes through one
// forwarding goroutine (one more channel hop than raft's own consumer).
type VoteGate struct {
	GatedTransport
	restricted func() bool
	diverged   func() bool
	logger     *slog.Logger
	id         raft.ServerID
	ch         chan raft.RPC
	done       chan struct{}
	closeOnce  sync.Once
	wg         sync.WaitGroup
	lastLog    atomic.Int64 // unix ns of the last "refused a vote" line
}

// errDiverged answers InstallSnapshot on a node restricted for good.
var errDiverged = errors.New("refused: this node's state differs from the cluster's log and is kept as it is (see its /readyz)")

// errNotVoting answers TimeoutNow while restricted.
var errNotVoting = errors.New("not standing for election: this node lost raft log entries it had applied and has not caught up (see its /readyz)")

func NewVoteGate(inner GatedTransport, id raft.ServerID, restricted, diverged func() bool, logger *slog.Logger) *VoteGate {
	g := &VoteGate{GatedTransport: inner, restricted: restricted, diverged: diverged, logger: logger, id: id,
		ch: make(chan raft.RPC), done: make(chan struct{})}
	g.wg.Add(1)
	go g.forward()
	return g
}

// Consumer is the channel raft reads incoming RPCs from.
func (g *VoteGate) Consumer() <-chan raft.RPC { return g.ch }

func (g *VoteGate) forward() {
	defer g.wg.Done()
	in := g.GatedTransport.Consumer()
	for {
		select {
		case <-g.done:
			return
		case rpc := <-in:
			if g.restricted() && g.refuse(rpc) {
				continue
			}
			select {
			case g.ch <- rpc:
			case <-g.done:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		}
	}
}

// refuse answers a vote request or TimeoutNow itself; false for any other RPC.
func (g *VoteGate) refuse(rpc raft.RPC) bool {
	switch req := rpc.Command.(type) {
	case *raft.RequestVoteRequest:
		g.logRefusal("vote", req.ID, req.Term)
		rpc.Respond(&raft.RequestVoteResponse{RPCHeader: g.header(), Term: req.Term}, nil)
	case *raft.RequestPreVoteRequest:
		g.logRefusal("pre-vote", req.ID, req.Term)
		rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: g.header(), Term: req.Term}, nil)
	case *raft.TimeoutNowRequest:
		g.logRefusal("leadership transfer", req.ID, 0)
		rpc.Respond(nil, errNotVoting)
	case *raft.InstallSnapshotRequest:
		if !g.diverged() {
			return false
		}
		g.logRefusal("snapshot", req.ID, req.Term)
		// The snapshot's bytes follow on the connection: read them, or
		// the next request on it would be read from the middle of them.
		_, _ = io.Copy(io.Discard, rpc.Reader)
		rpc.Respond(nil, errDiverged)
	default:
		return false
	}
	return true
}

func (g *VoteGate) header() raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(g.id),
		Addr: g.EncodePeer(g.id, g.LocalAddr())}
}

// logRefusal logs a refused request, at most one line per 10 s.
func (g *VoteGate) logRefusal(what string, from []byte, term uint64) {
	now := time.Now().UnixNano()
	if last := g.lastLog.Load(); now-last < int64(10*time.Second) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.logger.Warn("refused a "+what+" request: this node lost raft log entries it had applied and has not caught up",
		"from", string(from), "term", term)
}

// RequestVote sends this node's vote request, unless restricted.
func (g *VoteGate) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if g.restricted() {
		*resp = raft.RequestVoteResponse{RPCHeader: args.RPCHeader, Term: args.Term}
		return nil
	}
	return g.GatedTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote sends this node's pre-vote request, unless restricted.
func (g *VoteGate) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if g.restricted() {
		*resp = raft.RequestPreVoteResponse{RPCHeader: args.RPCHeader, Term: args.Term}
		return nil
	}
	return g.GatedTransport.RequestPreVote(id, target, args, resp)
}

// TimeoutNow asks a peer to stand for election now, unless restricted.
func (g *VoteGate) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	if g.restricted() {
		return errNotVoting
	}
	return g.GatedTransport.TimeoutNow(id, target, args, resp)
}

// AppendEntriesPipeline opens raft's pipeline to a follower, with its
// answers always drained (pipeline.go: the transport's own can deadlock).
func (g *VoteGate) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := g.GatedTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return drainPipeline(p), nil
}

// Close stops the forwarding goroutine and closes the transport.
func (g *VoteGate) Close() error {
	g.closeOnce.Do(func() { close(g.done) })
	err := g.GatedTransport.Close()
	g.wg.Wait()
	return err
}
