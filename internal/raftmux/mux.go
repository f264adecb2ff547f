// Package raftmux puts every raft group of a node on the node's one raft
// port. A Mux owns the listener: it accepts a connection, completes the
// TLS handshake when TLS is on (client certificates of the cluster's CA
// required, as for raft before groups existed), reads which group the
// connection is for from its first bytes (header.go) and hands it to that
// group's Layer, a raft.StreamLayer under the group's own
// raft.NetworkTransport. A Layer's Dial tags each connection it opens for
// its group. Connections that carry no tag belong to the Default group,
// and the Default group's dials carry none: a node of the previous
// release, which knows one group, talks to this one unchanged.
//
// It is only the transport's plumbing: it does not know what a group
// holds, who its members are, or how raft uses the connections.
package raftmux

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/tlsconf"
)

// Defaults of Config, and of the transports Transport makes (the values
// mqd's raft transport had before groups: a pool of 8 connections per
// peer, 10 s I/O timeout).
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultRegisterWait  = 5 * time.Second
	MaxPool              = 8
	Timeout              = 10 * time.Second
	// maxPending bounds the connections whose handshake and header are
	// being read at once: a flood of idle connections costs at most this
	// many goroutines and fds, each for at most HeaderTimeout.
	maxPending = 256
)

// ErrClosed is a Mux or Layer that was closed.
var ErrClosed = fmt.Errorf("raft mux: %w", net.ErrClosed)

// ErrRegistered is a group that has a Layer already.
var ErrRegistered = errors.New("raft group already registered")

// Config configures a Mux.
type Config struct {
	// Addr is the address to listen on (host:port; port 0 picks one).
	Addr string
	// Advertise is the address peers dial; nil: the listener's address.
	Advertise net.Addr
	// TLS: mutual TLS on every connection, both ways; nil: plain TCP.
	TLS *tlsconf.Store
	// HeaderTimeout bounds the TLS handshake and the group header of an
	// accepted connection; zero: DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// RegisterWait is how long a connection for a group with no Layer
	// (yet: a node opening its groups one after another) waits for one
	// before it is closed; zero: DefaultRegisterWait.
	RegisterWait time.Duration
	Logger       *slog.Logger
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.Addr == "" {
		return errors.New("raft mux: listen address required")
	}
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = DefaultHeaderTimeout
	}
	if c.RegisterWait <= 0 {
		c.RegisterWait = DefaultRegisterWait
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Mux is a node's raft listener, shared by its groups.
type Mux struct {
	cfg       Config
	ln        net.Listener
	advertise net.Addr
	serverTLS *tls.Config // nil: plain TCP
	done      chan struct{}
	sem       chan struct{} // one token per connection being read (maxPending)
	wg        sync.WaitGroup
	refusals  refusals

	mu         sync.Mutex
	closed     bool
	layers     map[string]*Layer
	registered chan struct{}         // closed and replaced at each registration
	pending    map[net.Conn]struct{} // accepted, handshake or header not read yet
}

// New listens on cfg.Addr and starts accepting. Register the groups
// (Layer) right after: a connection for a group not registered yet waits
// RegisterWait for it.
func New(cfg Config) (*Mux, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("raft mux: %w", err)
	}
	m := &Mux{cfg: cfg, ln: ln, advertise: cfg.Advertise, done: make(chan struct{}),
		sem: make(chan struct{}, maxPending), layers: map[string]*Layer{},
		registered: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	m.refusals.seen = map[string]*refusal{}
	if m.advertise == nil {
		m.advertise = ln.Addr()
	}
	if cfg.TLS != nil {
		m.serverTLS = cfg.TLS.ServerConfig(tls.RequireAndVerifyClientCert)
	}
	m.wg.Add(1)
	go m.accept()
	return m, nil
}

// Addr is the address the listener is bound to.
func (m *Mux) Addr() net.Addr { return m.ln.Addr() }

// Layer registers group and returns its stream layer. Default is the
// group of untagged connections.
func (m *Mux) Layer(group string) (*Layer, error) {
	if group != Default {
		if err := ValidGroup(group); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if m.layers[group] != nil {
		return nil, fmt.Errorf("%w: %q", ErrRegistered, group)
	}
	l := &Layer{m: m, group: group, ch: make(chan net.Conn), done: make(chan struct{}), conns: map[*conn]struct{}{}}
	if group != Default {
		l.header = appendHeader(nil, group)
	}
	m.layers[group] = l
	close(m.registered)
	m.registered = make(chan struct{})
	return l, nil
}

// Transport registers group and returns its raft transport, configured as
// mqd's raft transport is (MaxPool, Timeout).
func (m *Mux) Transport(group string, logger hclog.Logger) (*raft.NetworkTransport, error) {
	l, err := m.Layer(group)
	if err != nil {
		return nil, err
	}
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: l, MaxPool: MaxPool, Timeout: Timeout, Logger: logger,
	}), nil
}

// Close stops accepting, closes every layer with its connections, and
// returns when the mux's goroutines have ended.
func (m *Mux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.done)
	err := m.ln.Close()
	for c := range m.pending {
		_ = c.Close()
	}
	layers := make([]*Layer, 0, len(m.layers))
	for _, l := range m.layers {
		layers = append(layers, l)
	}
	m.mu.Unlock()
	for _, l := range layers {
		_ = l.Close()
	}
	m.wg.Wait()
	return err
}

func (m *Mux) unregister(l *Layer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.layers[l.group] == l {
		delete(m.layers, l.group)
	}
}

// accept hands each connection to a goroutine of its own: a peer that is
// slow to shake hands or send its header holds only that goroutine.
func (m *Mux) accept() {
	defer m.wg.Done()
	var delay time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			m.refusals.log(m.cfg.Logger, "accept", fmt.Errorf("raft accept: %w", err))
			select {
			case <-m.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		select {
		case m.sem <- struct{}{}:
		default:
			_ = c.Close()
			m.refusals.log(m.cfg.Logger, peerOf(c), errors.New("raft connection refused: too many connections awaiting their handshake or header"))
			continue
		}
		if !m.track(c) {
			_ = c.Close()
			<-m.sem
			return
		}
		m.wg.Add(1)
		go m.serve(c)
	}
}

func (m *Mux) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.pending[c] = struct{}{}
	return true
}

func (m *Mux) untrack(c net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, c)
}

// serve reads a connection's handshake and header and hands it to its
// group's layer, or closes it.
func (m *Mux) serve(raw net.Conn) {
	defer m.wg.Done()
	c, group, first, err := m.open(raw)
	m.untrack(raw)
	<-m.sem
	if err == nil {
		var l *Layer
		if l, err = m.await(group); err == nil {
			err = l.deliver(&conn{Conn: c, first: first, l: l}, m.cfg.RegisterWait)
		}
	}
	if err != nil {
		_ = raw.Close()
		if !errors.Is(err, ErrClosed) {
			m.refusals.log(m.cfg.Logger, peerOf(raw), fmt.Errorf("raft connection refused: %w", err))
		}
	}
}

// open completes the TLS handshake and reads the header, both within
// HeaderTimeout.
func (m *Mux) open(raw net.Conn) (c net.Conn, group string, first []byte, err error) {
	if err := raw.SetDeadline(time.Now().Add(m.cfg.HeaderTimeout)); err != nil {
		return nil, "", nil, err
	}
	c = raw
	if m.serverTLS != nil {
		tc := tls.Server(raw, m.serverTLS)
		if err := tc.Handshake(); err != nil {
			return nil, "", nil, fmt.Errorf("tls handshake: %w", err)
		}
		c = tc
	}
	if group, first, err = readHeader(c); err != nil {
		return nil, "", nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, "", nil, err
	}
	return c, group, first, nil
}

// await is group's layer, waiting RegisterWait for it to be registered.
func (m *Mux) await(group string) (*Layer, error) {
	t := time.NewTimer(m.cfg.RegisterWait)
	defer t.Stop()
	for {
		m.mu.Lock()
		l, reg, closed := m.layers[group], m.registered, m.closed
		m.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case l != nil:
			return l, nil
		}
		select {
		case <-reg:
		case <-m.done:
			return nil, ErrClosed
		case <-t.C:
			return nil, fmt.Errorf("%w: %q", ErrUnknownGroup, group)
		}
	}
}

func peerOf(c net.Conn) string {
	a := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}
