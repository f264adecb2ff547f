package raftmux_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/raftmux"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/tlsconf"
)

// logBuf collects a mux's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func quiet() hclog.Logger { return hclog.NewNullLogger() }

func mustMux(t testing.TB, cfg raftmux.Config) *raftmux.Mux {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m, err := raftmux.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func mustTransport(t testing.TB, m *raftmux.Mux, group string) *raft.NetworkTransport {
	t.Helper()
	tr, err := m.Transport(group, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// answer serves a transport's RPCs until it closes: AppendEntries and
// RequestVote are answered with term, so a caller sees which group's
// transport received its RPC.
func answer(tr raft.Transport, term uint64) {
	go func() {
		for rpc := range tr.Consumer() {
			switch rpc.Command.(type) {
			case *raft.AppendEntriesRequest:
				rpc.Respond(&raft.AppendEntriesResponse{Term: term, Success: true}, nil)
			case *raft.RequestVoteRequest:
				rpc.Respond(&raft.RequestVoteResponse{Term: term, Granted: true}, nil)
			default:
				rpc.Respond(nil, errors.New("unexpected rpc"))
			}
		}
	}()
}

// Consumer channels are never closed by raft; answer's goroutine ends
// with the test binary. Tests that count goroutines use serveUntil.
func serveUntil(tr raft.Transport, term uint64, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case rpc := <-tr.Consumer():
				rpc.Respond(&raft.AppendEntriesResponse{Term: term, Success: true}, nil)
			}
		}
	}()
}

func appendTo(tr raft.Transport, addr raft.ServerAddress) (uint64, error) {
	var resp raft.AppendEntriesResponse
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("client"), Addr: []byte("client")}, Term: 7,
		Entries: []*raft.Log{{Index: 1, Term: 7, Type: raft.LogCommand, Data: []byte("entry")}}}
	err := tr.AppendEntries("peer", addr, req, &resp)
	return resp.Term, err
}

func voteTo(tr raft.Transport, addr raft.ServerAddress) (uint64, error) {
	var resp raft.RequestVoteResponse
	req := &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("client"), Addr: []byte("client")}, Term: 7}
	err := tr.RequestVote("peer", addr, req, &resp)
	return resp.Term, err
}

// Two groups on each of two muxes: every RPC a group's transport sends
// reaches the same group's transport on the peer, over one port each.
func TestTwoGroupsOneListener(t *testing.T) {
	a, b := mustMux(t, raftmux.Config{}), mustMux(t, raftmux.Config{})
	terms := map[string]uint64{raftmux.Default: 10, "data-1": 11, "data-2": 12}
	from := map[string]*raft.NetworkTransport{}
	for g, term := range terms {
		from[g] = mustTransport(t, a, g)
		answer(mustTransport(t, b, g), term)
	}
	to := raft.ServerAddress(b.Addr().String())
	for range 3 { // later rounds reuse pooled connections
		for g, want := range terms {
			if got, err := appendTo(from[g], to); err != nil || got != want {
				t.Fatalf("group %q AppendEntries: answered by term %d (%v), want %d", g, got, err, want)
			}
			if got, err := voteTo(from[g], to); err != nil || got != want {
				t.Fatalf("group %q RequestVote: answered by term %d (%v), want %d", g, got, err, want)
			}
		}
	}
	if got := from["data-1"].LocalAddr(); got != raft.ServerAddress(a.Addr().String()) {
		t.Fatalf("a group's local address %s, want the mux's %s", got, a.Addr())
	}
}

// A node of the previous release (raft's own TCP transport, no tags)
// reaches the default group, and the default group's dials reach it; a
// tagged group's dial is not understood by it.
func TestLegacyPeerTalksToDefaultGroup(t *testing.T) {
	legacy, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 2, 5*time.Second, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	answer(legacy, 99)
	m := mustMux(t, raftmux.Config{})
	def, data := mustTransport(t, m, raftmux.Default), mustTransport(t, m, "data-1")
	answer(def, 10)
	answer(data, 11)
	if got, err := appendTo(legacy, raft.ServerAddress(m.Addr().String())); err != nil || got != 10 {
		t.Fatalf("legacy → mux: answered by term %d (%v), want the default group's 10", got, err)
	}
	if got, err := voteTo(legacy, raft.ServerAddress(m.Addr().String())); err != nil || got != 10 {
		t.Fatalf("legacy → mux vote: answered by term %d (%v), want 10", got, err)
	}
	if got, err := appendTo(def, legacy.LocalAddr()); err != nil || got != 99 {
		t.Fatalf("default group → legacy: answered by term %d (%v), want 99", got, err)
	}
	if got, err := appendTo(data, legacy.LocalAddr()); err == nil {
		t.Fatalf("tagged group → legacy answered (term %d): the tag was not sent", got)
	}
}

// expectClosed: the server hangs up on c (EOF or reset) before the deadline.
func expectClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the mux kept the connection open (%v)", what, err)
	}
}

// Bad headers and unknown groups are closed, logged once per peer; a
// silent client is closed at the header timeout and holds up no one.
func TestRefusedConnections(t *testing.T) {
	var log logBuf
	m := mustMux(t, raftmux.Config{HeaderTimeout: 2 * time.Second, RegisterWait: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	answer(mustTransport(t, m, "data-1"), 11)
	silent, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// While the silent one waits, another peer's RPC goes through.
	client := mustMux(t, raftmux.Config{})
	if got, err := appendTo(mustTransport(t, client, "data-1"), raft.ServerAddress(m.Addr().String())); err != nil || got != 11 {
		t.Fatalf("RPC beside a silent connection: term %d, %v", got, err)
	}
	_ = silent.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var ne net.Error
	if _, err := silent.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the silent connection was closed (%v) before the other peer's RPC was served", err)
	}
	for name, hdr := range map[string][]byte{
		"unknown group":         append([]byte{0x80, 7}, "data-77"...),
		"other marker":          {0x81, 1, 'a'},
		"zero length":           {0x80, 0},
		"too long":              {0x80, 65},
		"bad byte":              {0x80, 2, 'a', '/'},
		"default, unregistered": {0}, // no default group on this mux
	} {
		c, err := net.Dial("tcp", m.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
		expectClosed(t, c, name)
		c.Close()
	}
	expectClosed(t, silent, "silent client")
	if n := strings.Count(log.String(), "raft connection refused"); n != 1 {
		t.Fatalf("%d refusal lines for one peer within a minute, want 1:\n%s", n, log.String())
	}
}

// A connection for a group registered shortly after it arrives waits for
// the group instead of being refused.
func TestGroupRegisteredLater(t *testing.T) {
	m := mustMux(t, raftmux.Config{RegisterWait: 5 * time.Second})
	client := mustTransport(t, mustMux(t, raftmux.Config{}), "late")
	res := make(chan error, 1)
	go func() {
		got, err := appendTo(client, raft.ServerAddress(m.Addr().String()))
		if err == nil && got != 13 {
			err = errors.New("answered by the wrong group")
		}
		res <- err
	}()
	// Give the RPC's header time to reach the mux before the group
	// exists (were it later, the test would pass without testing the
	// wait); registered now, the RPC must still arrive.
	time.Sleep(100 * time.Millisecond)
	answer(mustTransport(t, m, "late"), 13)
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RPC to a group registered late did not return")
	}
}

// Closing one group's transport leaves the port to the others; the group
// can be registered again.
func TestCloseOneGroup(t *testing.T) {
	m := mustMux(t, raftmux.Config{RegisterWait: 100 * time.Millisecond})
	answer(mustTransport(t, m, "data-1"), 11)
	d2, err := m.Transport("data-2", quiet())
	if err != nil {
		t.Fatal(err)
	}
	answer(d2, 12)
	cm := mustMux(t, raftmux.Config{})
	c1, c2 := mustTransport(t, cm, "data-1"), mustTransport(t, cm, "data-2")
	to := raft.ServerAddress(m.Addr().String())
	if _, err := appendTo(c2, to); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Transport("data-2", quiet()); !errors.Is(err, raftmux.ErrRegistered) {
		t.Fatalf("second registration of data-2: %v, want ErrRegistered", err)
	}
	d2.Close()
	if got, err := appendTo(c1, to); err != nil || got != 11 {
		t.Fatalf("data-1 after data-2 closed: term %d, %v", got, err)
	}
	if _, err := appendTo(c2, to); err == nil {
		t.Fatal("closed group data-2 still answered")
	}
	answer(mustTransport(t, m, "data-2"), 22)
	if got, err := appendTo(c2, to); err != nil || got != 22 {
		t.Fatalf("data-2 registered again: term %d, %v", got, err)
	}
}

func mustTLS(t *testing.T, ca *tc.CA, name string) *tlsconf.Store {
	t.Helper()
	cert, key := ca.Issue(name)
	s, err := tlsconf.Load(tlsconf.Files{Cert: cert, Key: key, CA: ca.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// With TLS, groups and the untagged default group work over mutual TLS;
// a client without a certificate, or with one of another CA, gets no
// connection; a plain TCP client neither.
func TestTLS(t *testing.T) {
	ca, other := tc.NewCA(t, "cluster"), tc.NewCA(t, "other")
	a := mustMux(t, raftmux.Config{TLS: mustTLS(t, ca, "a")})
	b := mustMux(t, raftmux.Config{TLS: mustTLS(t, ca, "b")})
	for g, term := range map[string]uint64{raftmux.Default: 10, "data-1": 11} {
		answer(mustTransport(t, b, g), term)
		if got, err := appendTo(mustTransport(t, a, g), raft.ServerAddress(b.Addr().String())); err != nil || got != term {
			t.Fatalf("group %q over TLS: term %d, %v", g, got, err)
		}
	}
	foreign := other.KeyPair("rogue")
	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "other CA": &foreign} {
		cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		if cert != nil {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		d := &tls.Dialer{Config: cfg}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := d.DialContext(ctx, "tcp", b.Addr().String())
		cancel()
		if err != nil {
			continue // refused in the handshake
		}
		// TLS 1.3: the server checks the client's certificate after the
		// client's handshake ends; the refusal shows on the first read.
		_, _ = c.Write([]byte{0})
		expectClosed(t, c, name)
		c.Close()
	}
	plain := mustTransport(t, mustMux(t, raftmux.Config{}), raftmux.Default)
	if _, err := appendTo(plain, raft.ServerAddress(b.Addr().String())); err == nil {
		t.Fatal("plain TCP RPC answered by a TLS mux")
	}
}

// Muxes, groups and connections closed, the goroutines they ran are gone.
func TestNoGoroutineLeak(t *testing.T) {
	ca := tc.NewCA(t, "cluster")
	before := runtime.NumGoroutine()
	for _, useTLS := range []bool{false, true} {
		var ta, tb *tlsconf.Store
		if useTLS {
			ta, tb = mustTLS(t, ca, "a"), mustTLS(t, ca, "b")
		}
		a, err := raftmux.New(raftmux.Config{Addr: "127.0.0.1:0", TLS: ta, HeaderTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		b, err := raftmux.New(raftmux.Config{Addr: "127.0.0.1:0", TLS: tb, HeaderTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var trs []*raft.NetworkTransport
		for _, g := range []string{raftmux.Default, "data-1", "data-2"} {
			ca, err := a.Transport(g, quiet())
			if err != nil {
				t.Fatal(err)
			}
			cb, err := b.Transport(g, quiet())
			if err != nil {
				t.Fatal(err)
			}
			serveUntil(cb, 1, stop, &wg)
			trs = append(trs, ca, cb)
			for range 4 {
				if _, err := appendTo(ca, raft.ServerAddress(b.Addr().String())); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A connection left half-way through its header when b closes.
		half, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = half.Write([]byte{0x80})
		close(stop)
		wg.Wait()
		for _, tr := range trs {
			tr.Close()
		}
		a.Close()
		b.Close()
		half.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after closing, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
