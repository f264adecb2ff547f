package raftfsm

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Readiness (GET /readyz) of a follower is judged against the leader's
// commit index, asked at the time. Raft's own commit index on a follower
// is the lower of the leader's and the last entry the follower has
// received: after a restart, a pause or a partition it may be far behind
// while that index says it is caught up (it is 0 just after a start, and
// stops at the end of each append of up to 64 entries). A follower that
// keeps up applies what the leader had committed within milliseconds, so
// the check waits a little for it instead of answering 503 for every
// write in flight.
const (
	// readyAsk bounds the status request to the leader.
	readyAsk = 500 * time.Millisecond
	// readyFresh: one verdict answers every check for this long, and one
	// check runs at a time, so a flood of /readyz (an open route) costs
	// the node one check, and the leader one status request, per period.
	readyFresh = 50 * time.Millisecond
	// readyWait: how long a check waits for the FSM to reach the commit
	// index before it answers not ready.
	readyWait = 300 * time.Millisecond
	readyPoll = 5 * time.Millisecond
)

// Readiness is the verdict of a readiness check.
type Readiness struct {
	Ready  bool
	Reason string // why not, for a person
	// Applied and Commit: the FSM's applied index, and the commit index
	// it was judged against (on a follower, the leader's if higher).
	Applied, Commit uint64
	// CaughtUp: the metadata group is ready (it applied what the cluster
	// committed), though Ready may be false for a data group this node
	// holds that is out of elections (lost-log guard).
	CaughtUp bool
}

// readiness holds the latest verdict, and the client that asks the
// leader (made in Open, kept for its connections).
type readiness struct {
	mu sync.Mutex
	at time.Time
	v  Readiness
	hc *http.Client // set once in Open
}

// Ready reports whether the node is ready to serve: its clock agrees with
// the cluster's, it knows a leader (a leader: it has committed its term's
// first entry), it has applied everything the cluster had committed, and
// no raft group it holds, the default one or a data group, is out of
// elections for lost log entries (replica/lostlog.go).
func (n *Node) Ready(ctx context.Context) Readiness {
	r := &n.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < readyFresh {
		return r.v
	}
	r.v = n.judgeReady(ctx)
	r.at = time.Now()
	return r.v
}

func (n *Node) judgeReady(ctx context.Context) Readiness {
	v := Readiness{Applied: n.def.AppliedIndex(), Commit: n.def.CommitIndex()}
	if st := n.Clock(); st.Bad {
		v.Reason = st.Reason
		return v
	}
	if why := n.def.LostReason(); why != "" {
		v.Reason = why
		return v
	}
	lid, addr, ok := n.Leader()
	if !ok {
		v.Reason = "no leader known (an election, or this node is not in a cluster yet)"
		return v
	}
	if n.IsLeader() && !n.Serving() {
		v.Reason = "newly elected: not serving yet (applying what earlier terms committed, or checking the clocks)"
		return v
	}
	if v.Commit == 0 {
		v.Reason = "no commit index from a leader yet"
		return v
	}
	if !n.IsLeader() {
		lc, err := n.askLeaderCommit(ctx, lid, addr)
		if err != nil {
			v.Reason = fmt.Sprintf("the leader %s did not tell its commit index: %v (GET /v1/internal/status; it needs the cluster's --node-token or TLS certificates)", lid, err)
			return v
		}
		v.Commit = max(v.Commit, lc)
	}
	wait := time.NewTimer(readyWait)
	defer wait.Stop()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		v.Applied = n.def.AppliedIndex()
		if n.def.AppliedTo(v.Commit, v.Applied) {
			v.CaughtUp = true
			v.Reason = n.dataLostReason()
			v.Ready = v.Reason == ""
			return v
		}
		select {
		case <-tick.C:
			continue
		case <-wait.C:
		case <-ctx.Done():
		}
		v.Reason = fmt.Sprintf("catching up: applied %d of %d committed", v.Applied, v.Commit)
		return v
	}
}

// dataLostReason says why a data group this node holds neither votes nor
// stands for election (its log lost entries its state applied, or its
// state differs from the group's for good), "" when none is: such a
// replica serves nothing until it catches up, and the operator must learn
// of a diverged one as of the default group's (docs/operations.md).
func (n *Node) dataLostReason() string {
	groups := n.DataGroups()
	ids := slices.Sorted(maps.Keys(groups))
	for _, id := range ids {
		if why := groups[id].LostReason(); why != "" {
			return "data group " + id + ": " + why
		}
	}
	return ""
}

// askLeaderCommit is leader lid's commit index, by its answer to a status
// request made now.
func (n *Node) askLeaderCommit(ctx context.Context, lid, addr string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, readyAsk)
	defer cancel()
	st, err := n.getStatus(ctx, n.ready.hc, addr)
	if err == nil && st.ID != lid {
		err = fmt.Errorf("%s answers as %q", addr, st.ID)
	}
	return st.CommitIndex, err
}

// closeReady drops the connections kept for asking the leader (without
// waiting for a check in flight).
func (n *Node) closeReady() {
	n.ready.hc.CloseIdleConnections()
}
