package raftfsm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// A data dir records the id of the node it belongs to, in the stable store
// (raft.db), once the node is in its cluster's configuration under it.
// Raft knows a member by its id: the same dir started under another id is
// a stranger to its own cluster's configuration (it never votes, never
// leads, is never ready), so a mistyped --id, or a default id that moved
// with the raft address, would leave the member silently dead.
var keyNodeID = []byte("mqd_node_id")

// maxNodeIDLen bounds a new node id, in bytes.
const maxNodeIDLen = 128

var (
	// ErrInvalidNodeID refuses a new node's id.
	ErrInvalidNodeID = errors.New("invalid node id")
	// ErrNodeIDMismatch refuses to start a data dir under an id other
	// than the one it records.
	ErrNodeIDMismatch = errors.New("node id mismatch")
)

// ValidateNodeID checks a new node's id: 1 to 128 bytes of letters,
// digits and . _ - : @ [ ] (a raft address, the default id, is one).
// Names in paths and logs stay readable, and the id needs no escaping in
// a URL. A data dir that already records an id keeps it, whatever it is.
func ValidateNodeID(id string) error {
	if id == "" || len(id) > maxNodeIDLen {
		return fmt.Errorf("%w %q: 1 to %d bytes", ErrInvalidNodeID, id, maxNodeIDLen)
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-', c == ':', c == '@', c == '[', c == ']':
		default:
			return fmt.Errorf("%w %q: letters, digits and . _ - : @ [ ] only", ErrInvalidNodeID, id)
		}
	}
	return nil
}

// checkID refuses to start under an id other than the one the data dir
// records (with a message naming it), whether --id was given or is the
// default: a copy of a member's data dir (a cloned disk or image) must not
// take that member's id by itself, and a node moved to another address
// is named with --id by its operator.
func (n *Node) checkID(stable raft.StableStore) error {
	rec, err := stable.Get(keyNodeID)
	switch {
	case errors.Is(err, raftboltdb.ErrKeyNotFound) || (err == nil && len(rec) == 0):
		return nil
	case err != nil:
		return fmt.Errorf("read node id: %w", err)
	}
	n.idRecorded.Store(true)
	if recorded := string(rec); recorded != n.cfg.ID {
		return fmt.Errorf("%w: data dir %s belongs to node %q, not %q: start it with --id %s (or give node %q a new data dir)",
			ErrNodeIDMismatch, n.cfg.DataDir, recorded, n.cfg.ID, recorded, n.cfg.ID)
	}
	return nil
}

// recordID records this node's id in the data dir, once servers (the
// raft configuration) holds it: a dir whose first start used an id its
// configuration does not know (a restored backup started under the wrong
// --id) records nothing, and may be started again under the right one.
// Bootstrap records at once; a joining node, once the leader has added it
// (probeAll).
func (n *Node) recordID(servers []raft.Server) {
	if n.idRecorded.Load() || !slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == n.cfg.ID }) {
		return
	}
	if err := n.def.Stable().Set(keyNodeID, []byte(n.cfg.ID)); err != nil {
		if !n.idWarned.Swap(true) { // tried again every probe: say it once
			n.logger.Warn("could not record the node id in the data dir; trying again at every probe", "err", err)
		}
		return
	}
	n.idRecorded.Store(true)
}
