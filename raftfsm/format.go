package raftfsm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/internal/refusal"
	bolt "go.etcd.io/bbolt"
)

// The replicated state format says which records the state may hold. It
// is part of the state (meta "state_format", written by OpSetFormat in the
// same transaction as everything else, so snapshots carry it), and it only
// rises: the leader raises it once every member of the cluster runs a
// binary that reads the new format (raiseFormat), because a binary that
// does not would misread the records, silently (a range lease record looks
// like acked messages to a binary without range records).
//
//   - 1: every state written before the format existed (no meta key).
//   - 2: leases of keyless messages may be kept as range records
//     (group.UseSpans); a lease stops at LeaseMaxBytes; a publish looks
//     a key up before it checks the message's size.
//   - 3: a lease takes new messages starting at the partition after the
//     last one the group's previous lease took one from (a group key,
//     group.RotatePartitions), not at its raft index mod partitions;
//     OpProcess (process.go) is applied, and keeps each call's outcome
//     (group "po"/"pr" buckets, dedup kind 'o'); a publish counts the
//     publishes answered as duplicates of a key in the key's index entry;
//     an ack of a keyed message records with the processed key which
//     message it was and its deliveries (group.TraceKeys). A binary
//     before format 3 cannot decode OpProcess and would expire a kind 'o'
//     entry as corrupt.
//
// A format's rules are fixed once a release writes it
// (docs/ARCHITECTURE.md, State format).
const (
	// StateFormat is the highest format this binary reads and writes.
	StateFormat = 3
	// formatUnset is the format of a state without the meta key.
	formatUnset = 1
)

var keyFormat = []byte("state_format")

// storedFormat reads the state's format in tx.
func storedFormat(tx *bolt.Tx) int {
	if v := tx.Bucket(bktMeta).Get(keyFormat); len(v) == 8 {
		return int(binary.BigEndian.Uint64(v))
	}
	return formatUnset
}

// errFormatTooNew: a committed OpSetFormat names a format this binary
// cannot read. It is not a refusal: the rest of the cluster switched, and
// a replica that went on in the old format would diverge from it, so the
// node stops (as it does on an entry it cannot decode).
var errFormatTooNew = errors.New("state format newer than this binary reads")

// applySetFormat raises the state's format to c.Format; a lower or equal
// one changes nothing (a retried raise is harmless). ev.format follows, so
// that the commands after it in the same batch see the new format.
func applySetFormat(tx *bolt.Tx, c *command.Command, ev *Events) error {
	want := int(c.Format)
	if want > StateFormat {
		return fmt.Errorf("%w: format %d, this binary reads up to %d", errFormatTooNew, want, StateFormat)
	}
	if want <= ev.format {
		return nil
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(want))
	if err := tx.Bucket(bktMeta).Put(keyFormat, v[:]); err != nil {
		return err
	}
	ev.format = want
	return nil
}

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
	case cur <= formatUnset:
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
	if cur <= formatUnset {
		return nil
	}
	client := n.peerClient(probeTimeout)
	defer client.CloseIdleConnections()
	st, err := n.getStatus(ctx, client, info.HTTPAddr)
	return joinFormatCheck(cur, info, st, err)
}

// LeaseMaxBytes bounds a lease (a fetch's answer) from state format 2: it
// stops adding messages once their stored records hold this many bytes,
// so a fetch of up to 1000 messages of up to 16 MiB cannot make the
// leader copy and encode gigabytes for one answer. The first message is
// leased whatever its size.
const LeaseMaxBytes = 8 << 20

// useSpans switches a group to range lease records; a variable so that
// tests see which leases were applied with it.
var useSpans = (*group.Group).UseSpans

// StateFormat is the replicated state's format as of the last applied
// batch (or open, or restore).
func (f *FSM) StateFormat() int { return int(f.format.Load()) }

// formatProbe is what the leader needs of a member's latest probe.
type formatProbe struct {
	max   int  // the highest state format the member's binary reads; 0 from a binary older than formats
	fresh bool // a successful answer within probeStale
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
		out[id] = formatProbe{max: v.status.StateFormatMax, fresh: v.answered(now)}
	}
	return out
}

// formatLagging lists the members other than self whose fresh probe says
// their binary reads less than format cur: after the raise, that is an
// older binary started on a member's data dir, which misreads the state.
// Every binary reads format 1, whatever it reports.
func formatLagging(cur int, self string, members []raft.Server, probes map[string]formatProbe) []string {
	if cur <= formatUnset {
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
	if !formatRaise(cur, StateFormat, n.cfg.ID, servers, probes) {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := n.Apply(actx, &command.Command{Op: command.OpSetFormat, Now: Now().UnixMilli(), Format: StateFormat}); err != nil {
		n.logger.Warn("propose state format", "format", StateFormat, "err", err)
		return
	}
	n.logger.Info("state format raised", "from", cur, "to", StateFormat, "members", len(servers))
}
