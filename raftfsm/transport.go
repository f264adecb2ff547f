package raftfsm

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/tlsconf"
)

// tlsStream is raft's stream layer over mutual TLS: it accepts only
// peers presenting a certificate of the cluster's CA, and dials peers
// presenting its own and verifying theirs. A node without the CA's
// certificate can neither send nor receive log entries.
type tlsStream struct {
	net.Listener
	adv net.Addr
	tls *tlsconf.Store
}

// Dial connects to a peer's raft address with mutual TLS.
func (s *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := s.tls.DialTimeout(string(addr), timeout)
	if err != nil {
		return nil, fmt.Errorf("raft dial %s: %w", addr, err)
	}
	return c, nil
}

// Addr is the address peers dial (the advertised one).
func (s *tlsStream) Addr() net.Addr { return s.adv }

// newTransport is raft's TCP transport, over mutual TLS when cfg.TLS is set.
func newTransport(cfg Config, adv *net.TCPAddr, logger hclog.Logger) (*raft.NetworkTransport, error) {
	if cfg.TLS == nil {
		return raft.NewTCPTransportWithLogger(cfg.RaftAddr, adv, 8, 10*time.Second, logger)
	}
	ln, err := net.Listen("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, err
	}
	stream := &tlsStream{Listener: cfg.TLS.Listener(ln, tls.RequireAndVerifyClientCert, 10*time.Second), adv: adv, tls: cfg.TLS}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 8, Timeout: 10 * time.Second, Logger: logger,
	}), nil
}
