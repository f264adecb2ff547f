package raftmux_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/raftmux"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/tlsconf"
)

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// transportPair is a client and a server transport for one way of
// building them; the server answers every RPC.
type transportPair func(b *testing.B) (client raft.Transport, server raft.ServerAddress)

func directPair(b *testing.B) (raft.Transport, raft.ServerAddress) {
	srv, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, raftmux.MaxPool, raftmux.Timeout, quiet())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	answer(srv, 1)
	cl, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, raftmux.MaxPool, raftmux.Timeout, quiet())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	return cl, srv.LocalAddr()
}

func muxPair(group string) transportPair {
	return func(b *testing.B) (raft.Transport, raft.ServerAddress) {
		sm := mustMux(b, raftmux.Config{})
		answer(mustTransport(b, sm, group), 1)
		return mustTransport(b, mustMux(b, raftmux.Config{}), group), raft.ServerAddress(sm.Addr().String())
	}
}

// BenchmarkAppendEntries: one AppendEntries round trip (one 256-byte
// entry) on an established connection, raft's own TCP transport against
// the mux's default (untagged) and a tagged group. The mux adds nothing
// per RPC but one method call per Read on the connection.
func BenchmarkAppendEntries(b *testing.B) {
	for _, c := range []struct {
		name string
		pair transportPair
	}{{"direct", directPair}, {"mux-default", muxPair(raftmux.Default)}, {"mux-group", muxPair("data-1")}} {
		b.Run(c.name, func(b *testing.B) {
			cl, to := c.pair(b)
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("c"), Addr: []byte("c")}, Term: 1,
				Entries: []*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: make([]byte, 256)}}}
			var resp raft.AppendEntriesResponse
			if err := cl.AppendEntries("s", to, req, &resp); err != nil { // the connection, dialed
				b.Fatal(err)
			}
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				if err := cl.AppendEntries("s", to, req, &resp); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// streamPair is a dialer and a listener for one way of building them.
type streamPair func(b *testing.B) (dial func() (net.Conn, error), accept func() (net.Conn, error))

func plainStreams(b *testing.B) (func() (net.Conn, error), func() (net.Conn, error)) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	return func() (net.Conn, error) { return net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second) }, ln.Accept
}

// tlsStreams is the stream layer mqd had before the mux: tlsconf's
// listener and dialer.
func tlsStreams(b *testing.B) (func() (net.Conn, error), func() (net.Conn, error)) {
	sst, cst := benchTLS(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	tl := sst.Listener(ln, tls.RequireAndVerifyClientCert, 10*time.Second)
	b.Cleanup(func() { ln.Close() })
	return func() (net.Conn, error) { return cst.DialTimeout(ln.Addr().String(), 5*time.Second) }, tl.Accept
}

func muxStreams(group string, useTLS bool) streamPair {
	return func(b *testing.B) (func() (net.Conn, error), func() (net.Conn, error)) {
		var sst, cst *tlsconf.Store
		if useTLS {
			sst, cst = benchTLS(b)
		}
		srv, err := mustMux(b, raftmux.Config{TLS: sst}).Layer(group)
		if err != nil {
			b.Fatal(err)
		}
		cl, err := mustMux(b, raftmux.Config{TLS: cst}).Layer(group)
		if err != nil {
			b.Fatal(err)
		}
		to := raft.ServerAddress(srv.Addr().String())
		return func() (net.Conn, error) { return cl.Dial(to, 5*time.Second) }, srv.Accept
	}
}

func benchTLS(b *testing.B) (server, client *tlsconf.Store) {
	benchCA := tc.NewCA(b, "bench")
	load := func(name string) *tlsconf.Store {
		c, k := benchCA.Issue(name)
		s, err := tlsconf.Load(tlsconf.Files{Cert: c, Key: k, CA: benchCA.CertPath()})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	return load("s"), load("c")
}

// BenchmarkConnect: what a new raft connection costs, from dial until
// the server's raft transport holds it and has read the first RPC byte;
// the mux adds the header (tagged groups) and a goroutine hand-off.
func BenchmarkConnect(b *testing.B) {
	for _, c := range []struct {
		name string
		pair streamPair
	}{
		{"plain/direct", plainStreams}, {"plain/mux-default", muxStreams(raftmux.Default, false)}, {"plain/mux-group", muxStreams("data-1", false)},
		{"tls/direct", tlsStreams}, {"tls/mux-default", muxStreams(raftmux.Default, true)}, {"tls/mux-group", muxStreams("data-1", true)},
	} {
		b.Run(c.name, func(b *testing.B) {
			dial, accept := c.pair(b)
			// The server side runs apart, as raft's accept loop does:
			// tlsconf's listener shakes hands on the first read.
			accepted := make(chan error, 1)
			go func() {
				for range b.N {
					sc, err := accept()
					if err == nil {
						_, err = sc.Read(make([]byte, 1))
						sc.Close()
					}
					accepted <- err
				}
			}()
			cpu := cpuTime()
			b.ResetTimer()
			for range b.N {
				cc, err := dial()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cc.Write([]byte{0}); err != nil {
					b.Fatal(err)
				}
				if err := <-accepted; err != nil {
					b.Fatal(err)
				}
				cc.Close()
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

func openFDs() int {
	es, _ := os.ReadDir("/proc/self/fd")
	return len(es)
}

// BenchmarkIdleGroups reports what an idle raft group costs a process
// holding both members of it (so twice a node's share): goroutines and
// fds per group, each group with its own port (raft's TCP transport) and
// all on one mux, from clusters of 1 and 4 groups of 2 members, after
// leaders are elected and 1 s of heartbeats. It is a measurement, run
// once: go test -run X -bench IdleGroups -benchtime 1x ./internal/raftmux/
func BenchmarkIdleGroups(b *testing.B) {
	for _, via := range []string{"direct", "mux"} {
		b.Run(via, func(b *testing.B) {
			for range b.N {
				g1, f1 := idleCost(b, via, 1)
				g4, f4 := idleCost(b, via, 4)
				b.ReportMetric(float64(g4-g1)/3, "goroutines/group")
				b.ReportMetric(float64(f4-f1)/3, "fds/group")
			}
		})
	}
}

func idleCost(b *testing.B, via string, groups int) (goroutines, fds int) {
	settle := func() { runtime.GC(); time.Sleep(200 * time.Millisecond) }
	settle()
	g0, f0 := runtime.NumGoroutine(), openFDs()
	var closers []func()
	var peers []raft.Server
	var muxes []*raftmux.Mux
	if via == "mux" {
		for i := range 2 {
			m, err := raftmux.New(raftmux.Config{Addr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			muxes = append(muxes, m)
			peers = append(peers, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: raft.ServerAddress(m.Addr().String())})
		}
	}
	var rafts []*raft.Raft
	for g := range groups {
		var trs []raft.Transport
		ps := peers
		if via == "mux" {
			for _, m := range muxes {
				tr, err := m.Transport(fmt.Sprint("g", g), quiet())
				if err != nil {
					b.Fatal(err)
				}
				trs = append(trs, tr)
			}
		} else {
			ps = nil
			for i := range 2 {
				tr, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, raftmux.MaxPool, raftmux.Timeout, quiet())
				if err != nil {
					b.Fatal(err)
				}
				trs = append(trs, tr)
				ps = append(ps, raft.Server{ID: raft.ServerID(fmt.Sprint("n", i)), Address: tr.LocalAddr()})
			}
		}
		for i, tr := range trs {
			c := raft.DefaultConfig()
			c.LocalID = raft.ServerID(fmt.Sprint("n", i))
			c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 300*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
			c.Logger = quiet()
			st := raft.NewInmemStore()
			r, err := raft.NewRaft(c, &listFSM{}, st, st, raft.NewInmemSnapshotStore(), tr)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.BootstrapCluster(raft.Configuration{Servers: ps}).Error(); err != nil {
				b.Fatal(err)
			}
			rafts = append(rafts, r)
			closers = append(closers, func() { r.Shutdown().Error(); tr.(*raft.NetworkTransport).Close() })
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for leaders := 0; leaders < groups; {
		if time.Now().After(deadline) {
			b.Fatal("no leaders in 20 s")
		}
		time.Sleep(50 * time.Millisecond)
		leaders = 0
		for _, r := range rafts {
			if r.State() == raft.Leader {
				leaders++
			}
		}
	}
	time.Sleep(time.Second)
	goroutines, fds = runtime.NumGoroutine()-g0, openFDs()-f0
	for _, c := range closers {
		c()
	}
	for _, m := range muxes {
		m.Close()
	}
	return goroutines, fds
}
