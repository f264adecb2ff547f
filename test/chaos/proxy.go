package chaos

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The network fault model.
//
// Every node advertises, as its --raft-advertise-addr, the address of a TCP
// proxy that this test process runs in front of the node's real
// --raft-addr. Peers dial a node's advertised address, so every Raft
// connection into node D passes through D's proxy.
//
// A partition needs to know, for each connection, which node dialed it. On
// loopback the kernel gives every outgoing connection the source address
// 127.0.0.1 whatever 127.x.y.z it goes to (checked empirically, and
// hashicorp/raft's TCP transport does not let a node choose its source
// address), so the source address says nothing. Instead the proxy looks the
// dialing socket up in /proc: the accepted connection's remote port is the
// local port of exactly one socket in /proc/net/tcp{,6} whose remote end is
// the proxy; that line gives the socket's inode, and the node process whose
// /proc/<pid>/fd holds "socket:[inode]" is the dialer. This works for
// processes of the same user, needs no privileges, and costs one scan per new
// connection (Raft keeps its connections pooled, so new ones are rare).
//
// With the source known, a Net enforces a partition (each node on a side; a
// connection is allowed only between nodes on the same side) in one of two
// modes, chosen per partition:
//   - reject: forbidden connections are closed, new ones are closed as soon
//     as accepted (the dialer sees a reset/EOF at once);
//   - blackhole: forbidden connections stay open but every byte in both
//     directions is discarded, and new ones are accepted and swallowed (the
//     dialer sees timeouts, as with a dropped link). On heal, blackholed
//     connections are closed (their streams lost bytes) and Raft redials.
//
// Limits, stated honestly:
//   - Only Raft traffic is cut. The nodes' HTTP listeners are not proxied
//     (the binary has no --http-advertise-addr), so a follower can still
//     forward a client's request to the leader over HTTP across a
//     "partition", and the test's clients reach every node. The faults are
//     therefore "replication network partitions", not full host isolation.
//   - A connection whose dialer cannot be identified (it closed before the
//     lookup, or /proc is unreadable) is allowed while the cluster is whole
//     and refused while any partition is active.
//   - Faults are symmetric (no one-way links), and there is no added latency,
//     reordering or packet loss short of a cut.
//   - Linux only (/proc).

// Mode is how a partition treats forbidden traffic.
type Mode int

const (
	// Reject closes forbidden connections.
	Reject Mode = iota
	// Blackhole keeps forbidden connections open and drops their bytes.
	Blackhole
)

func (m Mode) String() string {
	if m == Blackhole {
		return "blackhole"
	}
	return "reject"
}

// Net is the set of per-node Raft proxies and the partition they enforce.
type Net struct {
	mu      sync.Mutex
	side    map[string]int // node id → side; nil: fully connected
	mode    Mode
	proxies []*Proxy
	owner   func(pid int) string // node id of a process, "" if none
	pids    func() []int         // the processes that may be dialers

	identified, unidentified, refused atomic.Int64
}

// NewNet returns a Net; pids lists the node processes that may dial a proxy,
// and owner names the node of one of them.
func NewNet(pids func() []int, owner func(pid int) string) *Net {
	return &Net{pids: pids, owner: owner}
}

// allowed reports whether src may talk to dst now, and in which mode it is
// cut otherwise. An unidentified source is allowed only when there is no
// partition.
func (n *Net) allowed(src, dst string) (bool, Mode) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.side == nil {
		return true, n.mode
	}
	if src == "" {
		return false, n.mode
	}
	s, ok1 := n.side[src]
	d, ok2 := n.side[dst]
	return ok1 && ok2 && s == d, n.mode
}

// Partition splits the nodes into the given sides (every node id in exactly
// one side) and cuts existing connections between sides.
func (n *Net) Partition(mode Mode, sides ...[]string) {
	n.mu.Lock()
	n.side = map[string]int{}
	for i, s := range sides {
		for _, id := range s {
			n.side[id] = i
		}
	}
	n.mode = mode
	ps := append([]*Proxy(nil), n.proxies...)
	n.mu.Unlock()
	for _, p := range ps {
		p.enforce()
	}
}

// Heal reconnects everything: the partition is lifted and blackholed
// connections are closed so that Raft redials fresh ones.
func (n *Net) Heal() {
	n.mu.Lock()
	n.side = nil
	ps := append([]*Proxy(nil), n.proxies...)
	n.mu.Unlock()
	for _, p := range ps {
		p.healLinks()
	}
}

// Partitioned reports whether a partition is active.
func (n *Net) Partitioned() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.side != nil
}

// Close closes every proxy and its connections and waits for their goroutines.
func (n *Net) Close() {
	n.mu.Lock()
	ps := append([]*Proxy(nil), n.proxies...)
	n.mu.Unlock()
	for _, p := range ps {
		p.Close()
	}
}

// Stats are counters of the proxies' connection decisions.
func (n *Net) Stats() string {
	return fmt.Sprintf("connections identified %d, unidentified %d, refused %d",
		n.identified.Load(), n.unidentified.Load(), n.refused.Load())
}

// Proxy forwards the Raft connections into one node.
type Proxy struct {
	net    *Net
	dst    string // the node behind the proxy
	ln     net.Listener
	target atomic.Pointer[string]

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	src      string
	client   net.Conn // from the dialing node
	server   net.Conn // to the node behind the proxy; nil for a swallowed one
	dropping atomic.Bool
	once     sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		if l.server != nil {
			l.server.Close()
		}
	})
}

// NewProxy listens on a free loopback port for connections into node dst.
// Its target (the node's real Raft address) is set with SetTarget.
func (n *Net) NewProxy(dst string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{net: n, dst: dst, ln: ln, links: map[*link]struct{}{}}
	n.mu.Lock()
	n.proxies = append(n.proxies, p)
	n.mu.Unlock()
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listen address, to be the node's --raft-advertise-addr.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget sets the address the proxy forwards to.
func (p *Proxy) SetTarget(addr string) { p.target.Store(&addr) }

// Close stops accepting, closes every connection and waits for the goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *Proxy) handle(c net.Conn) {
	src := p.net.identify(c)
	ok, mode := p.net.allowed(src, p.dst)
	l := &link{src: src, client: c}
	if !ok {
		p.net.refused.Add(1)
		if mode == Reject {
			c.Close()
			return
		}
		// Blackhole: swallow whatever the dialer sends until heal or close.
		l.dropping.Store(true)
		if !p.add(l) {
			return
		}
		io.Copy(io.Discard, c)
		p.remove(l)
		return
	}
	tp := p.target.Load()
	if tp == nil {
		c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", *tp, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	l.server = s
	if !p.add(l) {
		return
	}
	// The partition may have changed between the decision and add; enforce
	// the current one on this link too.
	if ok, mode := p.net.allowed(src, p.dst); !ok {
		p.cut(l, mode)
	}
	done := make(chan struct{}, 2)
	go func() { pipe(l, s, c); done <- struct{}{} }()
	pipe(l, c, s)
	<-done
	p.remove(l)
}

// pipe copies from→to until either side fails, discarding the bytes while
// the link is blackholed, then closes the link.
func pipe(l *link, to, from net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		k, err := from.Read(buf)
		if k > 0 && !l.dropping.Load() {
			if _, werr := to.Write(buf[:k]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	l.close()
}

func (p *Proxy) add(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.close()
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) remove(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *Proxy) cut(l *link, mode Mode) {
	if mode == Reject {
		l.close()
	} else {
		l.dropping.Store(true)
	}
}

func (p *Proxy) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

// enforce cuts the links that the current partition forbids.
func (p *Proxy) enforce() {
	for _, l := range p.snapshot() {
		if ok, mode := p.net.allowed(l.src, p.dst); !ok {
			p.cut(l, mode)
		}
	}
}

// healLinks closes the blackholed links.
func (p *Proxy) healLinks() {
	for _, l := range p.snapshot() {
		if l.dropping.Load() {
			l.close()
		}
	}
}

// identify returns the id of the node whose process dialed c, or "".
func (n *Net) identify(c net.Conn) string {
	ra, ok1 := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		n.unidentified.Add(1)
		return ""
	}
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			time.Sleep(2 * time.Millisecond)
		}
		inode := socketInode(ra, la)
		if inode == "" {
			continue
		}
		pid := findSocketOwner(inode, n.pids())
		if pid == 0 {
			continue
		}
		if id := n.owner(pid); id != "" {
			n.identified.Add(1)
			return id
		}
	}
	n.unidentified.Add(1)
	return ""
}

// socketInode finds, in /proc/net/tcp and tcp6, the socket whose local end is
// local and whose remote end is remote, and returns its inode.
func socketInode(local, remote *net.TCPAddr) string {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if ino := scanTCPTable(f, local, remote); ino != "" {
			return ino
		}
	}
	return ""
}

func scanTCPTable(path string, local, remote *net.TCPAddr) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if procAddrEqual(fields[1], local) && procAddrEqual(fields[2], remote) {
			if fields[9] == "0" {
				return "" // time-wait or orphaned: no owner
			}
			return fields[9]
		}
	}
	return ""
}

// procAddrEqual compares a /proc/net/tcp{,6} address ("0100007F:1F90": the
// IP as 32-bit words in host byte order, the port in hex) with a.
func procAddrEqual(s string, a *net.TCPAddr) bool {
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return false
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil || int(port) != a.Port {
		return false
	}
	raw, err := hex.DecodeString(s[:i])
	if err != nil || len(raw)%4 != 0 {
		return false
	}
	// Each 4-byte word is printed in host (little-endian on the machines this
	// runs on) order: reverse each word.
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		ip[w], ip[w+1], ip[w+2], ip[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	return ip.Equal(a.IP)
}

// findSocketOwner returns the pid among pids whose fd table holds the socket.
func findSocketOwner(inode string, pids []int) int {
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}
