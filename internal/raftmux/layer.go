package raftmux

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Layer is one group's raft.StreamLayer: its Accept answers the
// connections the mux read this group's tag on (or no tag, for Default),
// its Dial opens connections tagged for the group. Closing it closes the
// group's connections, both ways, and leaves the listener to the others.
type Layer struct {
	m      *Mux
	group  string
	header []byte // the tag Dial writes; empty for Default
	ch     chan net.Conn
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	conns map[*conn]struct{} // open connections, accepted and dialed
}

var _ raft.StreamLayer = (*Layer)(nil)

// Group is the layer's group id.
func (l *Layer) Group() string { return l.group }

// Accept waits for the group's next connection.
func (l *Layer) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, ErrClosed
	}
}

// Addr is the address peers dial (the mux's advertised one).
func (l *Layer) Addr() net.Addr { return l.m.advertise }

// Close unregisters the group and closes its connections. raft's
// NetworkTransport.Close calls it; the listener stays open for the
// other groups.
func (l *Layer) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.m.unregister(l)
		l.mu.Lock()
		conns := l.conns
		l.conns = nil
		l.mu.Unlock()
		for c := range conns {
			_ = c.Conn.Close()
		}
	})
	return nil
}

// Dial connects to a peer's raft address (with mutual TLS when the mux
// has TLS) and tags the connection for the group.
func (l *Layer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	var err error
	if l.m.cfg.TLS != nil {
		c, err = l.m.cfg.TLS.DialTimeout(string(addr), timeout)
	} else {
		c, err = net.DialTimeout("tcp", string(addr), timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("raft dial %s: %w", addr, err)
	}
	if len(l.header) > 0 {
		err = c.SetWriteDeadline(time.Now().Add(timeout))
		if err == nil {
			_, err = c.Write(l.header)
		}
		if err == nil {
			err = c.SetWriteDeadline(time.Time{})
		}
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("raft dial %s: group header: %w", addr, err)
		}
	}
	tc := &conn{Conn: c, l: l}
	if !l.track(tc) {
		_ = c.Close()
		return nil, ErrClosed
	}
	return tc, nil
}

// deliver hands an accepted connection to Accept, waiting at most wait
// for raft to take it.
func (l *Layer) deliver(c *conn, wait time.Duration) error {
	if !l.track(c) {
		return ErrClosed
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case l.ch <- c:
		return nil
	case <-l.done:
		return ErrClosed
	case <-l.m.done:
		return ErrClosed
	case <-t.C:
		_ = c.Close()
		return fmt.Errorf("group %q accepted no connection for %s", l.group, wait)
	}
}

func (l *Layer) track(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Layer) untrack(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
}

// conn is a group's connection: it gives back the byte the mux read to
// find an untagged connection's group, and leaves the layer's set when
// closed.
type conn struct {
	net.Conn
	first []byte // read by the mux, not yet by raft (one reader: raft's)
	l     *Layer
	once  sync.Once
	err   error
}

func (c *conn) Read(b []byte) (int, error) {
	if len(c.first) > 0 && len(b) > 0 {
		n := copy(b, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.untrack(c)
		c.err = c.Conn.Close()
	})
	return c.err
}
