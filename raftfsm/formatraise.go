package raftfsm

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/internal/refusal"
)

// ErrFormatUnsupported refuses to add a node to a cluster whose state is
// in a format the node's binary does not read (it would misread the
// snapshot it is sent).
var ErrFormatUnsupported = refusal.New(409, "state_format_unsupported",
	"the node's binary does not read the cluster's state format")

// joinFormatCheck decides whether a node may be added to a cluster whose
// state is in format cur, from the answer (st, or err) of the node's
// /v1/internal/status. Every binary reads format 1.
func joinFormatCheck(cur int, info command.NodeInfo, st Status, err error) error {
	switch {
	case cur <= fsm.FormatUnset:
		return nil
	case err != nil:
		return fmt.Errorf("%w: %s did not say which state formats it reads (%v)", ErrFormatUnsupported, info.ID, err)
	case st.ID != info.ID:
		return fmt.Errorf("%w: %s answers as %q", ErrFormatUnsupported, info.HTTPAddr, st.ID)
	case st.StateFormatMax < cur:
		return fmt.Errorf("%w: %s reads state formats up to %d, the cluster's is %d (run the current binary on it)",
			ErrFormatUnsupported, info.ID, st.StateFormatMax, cur)
	}
	return nil
}

// checkJoiner asks a node about to be added which state formats its
// binary reads, unless the state is in format 1.
func (n *Node) checkJoiner(ctx context.Context, info command.NodeInfo) error {
	cur := n.FSM.StateFormat()
	if cur <= fsm.FormatUnset {
		return nil
	}
	client := n.peerClient(probeTimeout)
	defer client.CloseIdleConnections()
	st, err := n.getStatus(ctx, client, info.HTTPAddr)
	return joinFormatCheck(cur, info, st, err)
}

// formatProbe is what the leader needs of a member's latest probe.
type formatProbe struct {
	max   int  // the highest state format the member's binary reads; 0 from a binary older than formats
	fresh bool // a successful answer within probeStale
	known bool // max is from an answer, however old (the member may be down since)
}

// formatRaise says whether the leader may raise the state from format cur
// to want: only when every member of the configuration other than self
// (voters and non-voters alike: any of them may be sent a snapshot, or
// become leader) answered its latest probe recently and reads want.
func formatRaise(cur, want int, self string, members []raft.Server, probes map[string]formatProbe) bool {
	if cur >= want {
		return false
	}
	for _, s := range members {
		id := string(s.ID)
		if id == self {
			continue
		}
		p, ok := probes[id]
		if !ok || !p.fresh || p.max < want {
			return false
		}
	}
	return true
}

// formatProbes collects the members' latest probe answers.
func (n *Node) formatProbes(now time.Time) map[string]formatProbe {
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	out := make(map[string]formatProbe, len(n.peers.views))
	for id, v := range n.peers.views {
		out[id] = formatProbe{max: v.status.StateFormatMax, fresh: v.answered(now), known: !v.lastOK.IsZero()}
	}
	return out
}

// olderMember is a member other than self whose latest answer, however
// old, said its binary reads less than format want, or "": while one runs
// (or was last seen running) such a binary, the state cannot reach want,
// so nothing should wait for it (a rolling upgrade under way).
func olderMember(want int, self string, members []raft.Server, probes map[string]formatProbe) string {
	for _, s := range members {
		id := string(s.ID)
		if p, ok := probes[id]; ok && id != self && p.known && p.max < want {
			return id
		}
	}
	return ""
}

// formatLagging lists the members other than self whose fresh probe says
// their binary reads less than format cur: after the raise, that is an
// older binary started on a member's data dir, which misreads the state.
// Every binary reads format 1, whatever it reports.
func formatLagging(cur int, self string, members []raft.Server, probes map[string]formatProbe) []string {
	if cur <= fsm.FormatUnset {
		return nil
	}
	var out []string
	for _, s := range members {
		id := string(s.ID)
		if p, ok := probes[id]; ok && id != self && p.fresh && p.max < cur {
			out = append(out, id)
		}
	}
	return out
}

// checkFormat runs on the leader once it leads and then every second. It
// proposes OpSetFormat{StateFormat} once the state is older and every
// member reads it (a failed proposal is tried again at the next call);
// once the state is newer than what a member reads, it warns about that
// member (once while it stays so; warned holds those already named).
func (n *Node) checkFormat(ctx context.Context, warned map[string]bool) {
	cur := n.FSM.StateFormat()
	servers, err := n.Servers()
	if err != nil {
		return
	}
	probes := n.formatProbes(time.Now())
	lagging := formatLagging(cur, n.cfg.ID, servers, probes)
	for id := range warned {
		if !slices.Contains(lagging, id) {
			delete(warned, id)
		}
	}
	for _, id := range lagging {
		if !warned[id] {
			warned[id] = true
			n.logger.Warn("member runs a binary that cannot read the state format: it misreads the state; upgrade it",
				"member", id, "reads_up_to", probes[id].max, "state_format", cur)
		}
	}
	if !formatRaise(cur, fsm.StateFormat, n.cfg.ID, servers, probes) {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := n.Apply(actx, &command.Command{Op: command.OpSetFormat, Now: Now().UnixMilli(), Format: fsm.StateFormat}); err != nil {
		n.logger.Warn("propose state format", "format", fsm.StateFormat, "err", err)
		return
	}
	n.logger.Info("state format raised", "from", cur, "to", fsm.StateFormat, "members", len(servers))
}
