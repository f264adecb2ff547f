package raftfsm

import (
	"errors"
	"fmt"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// A data dir records the id of the node it belongs to, in the stable store
// (raft.db), at the node's first start. Raft knows a member by its id: the
// same dir started under another id is a stranger to its own cluster's
// configuration (it never votes, never leads, is never ready), so a
// mistyped --id, or a default id that moved with the raft address, would
// leave the member silently dead.
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

// settleID reconciles the configured id with the one the data dir
// records. A dir that records none (new, or made by mqd before ids were
// recorded) records the configured one. A dir that records another is
// refused when --id was given, and its recorded id is taken when the id
// was only the default (the raft address, which may have changed).
func (n *Node) settleID() error {
	rec, err := n.stores.stable.Get(keyNodeID)
	switch {
	case errors.Is(err, raftboltdb.ErrKeyNotFound) || (err == nil && len(rec) == 0):
		if err := n.stores.stable.Set(keyNodeID, []byte(n.cfg.ID)); err != nil {
			return fmt.Errorf("record node id: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("read node id: %w", err)
	}
	recorded := string(rec)
	switch {
	case recorded == n.cfg.ID:
	case n.cfg.idDefault:
		n.logger.Info("node id taken from the data dir", "id", recorded, "default_was", n.cfg.ID)
		n.cfg.ID = recorded
	default:
		return fmt.Errorf("%w: data dir %s belongs to node %q, not %q: start it with --id %s (or give node %q a new data dir)",
			ErrNodeIDMismatch, n.cfg.DataDir, recorded, n.cfg.ID, recorded, n.cfg.ID)
	}
	return nil
}
