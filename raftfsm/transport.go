package raftfsm

import (
	"errors"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/raftmux"
)

// errNotAdvertisable is an advertised raft address peers cannot dial
// (what raft's own TCP transport refused before the mux).
var errNotAdvertisable = errors.New("raft advertise address is not advertisable (unspecified IP)")

// openTransport opens the node's one raft port (internal/raftmux: plain
// TCP, or mutual TLS when cfg.TLS is set) and the transport of its
// default group, the one nodes of the previous release talk to. Further
// groups get theirs from the mux (Node.RaftMux).
func openTransport(cfg Config, adv *net.TCPAddr, logger hclog.Logger) (*raftmux.Mux, *raft.NetworkTransport, error) {
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, nil, fmt.Errorf("%w: %s", errNotAdvertisable, adv)
	}
	m, err := raftmux.New(raftmux.Config{Addr: cfg.RaftAddr, Advertise: adv, TLS: cfg.TLS, Logger: cfg.Logger})
	if err != nil {
		return nil, nil, err
	}
	nt, err := m.Transport(raftmux.Default, logger)
	if err != nil {
		_ = m.Close()
		return nil, nil, err
	}
	return m, nt, nil
}

// RaftMux is the node's raft port, shared by its groups: a group's
// transport is RaftMux().Transport(id, logger).
func (n *Node) RaftMux() *raftmux.Mux { return n.mux }

// closeTransport closes the default group's transport, then the port.
func (n *Node) closeTransport() {
	n.trans.Close()
	_ = n.mux.Close()
}
