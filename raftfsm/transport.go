package raftfsm

import (
	"errors"
	"fmt"
	"net"

	"github.com/mqd/mqd/internal/raftmux"
	"github.com/mqd/mqd/replica"
)

// errNotAdvertisable is an advertised raft address peers cannot dial
// (what raft's own TCP transport refused before the mux).
var errNotAdvertisable = errors.New("raft advertise address is not advertisable (unspecified IP)")

// openMux opens the node's one raft port (internal/raftmux: plain TCP, or
// mutual TLS when cfg.TLS is set); every group gets its transport from it
// (Node.groupTransport).
func openMux(cfg Config, adv *net.TCPAddr) (*raftmux.Mux, error) {
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, fmt.Errorf("%w: %s", errNotAdvertisable, adv)
	}
	return raftmux.New(raftmux.Config{Addr: cfg.RaftAddr, Advertise: adv, TLS: cfg.TLS, Logger: cfg.Logger})
}

// muxGroup is the mux's name of group id: the default group is the mux's
// untagged one, the group nodes of the previous release talk to.
func muxGroup(id string) string {
	if id == replica.DefaultGroup {
		return raftmux.Default
	}
	return id
}

// RaftMux is the node's raft port, shared by its groups.
func (n *Node) RaftMux() *raftmux.Mux { return n.mux }

// closeMux closes the raft port, after the groups' transports.
func (n *Node) closeMux() {
	if n.mux != nil {
		_ = n.mux.Close()
	}
}
