package api

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits bounds what clients can hold on one node. Zero fields take the
// defaults of DefaultLimits.
type Limits struct {
	// MaxConns is the most client connections open at once; one more is
	// answered 503 and closed.
	MaxConns int
	// MaxConnsPerIP is the most open connections from one client address;
	// one more is answered 429 and closed.
	MaxConnsPerIP int
	// ReadTimeout bounds the wait for a new connection's first request and
	// the reading of each request head; a body gets this plus its declared
	// length at bodyMinRate.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this long.
	IdleTimeout time.Duration
	// ForwardConns is the most connections a follower opens to the leader
	// to forward requests; long-polls use at most half of them, and only
	// for short fetches.
	ForwardConns int
	// BodyBudget is the most request body bytes admitted at once (bodies
	// over 64 KiB count; a request that would pass it answers 503).
	BodyBudget int64
}

// DefaultLimits are the limits of a node started without flags.
func DefaultLimits() Limits {
	return Limits{MaxConns: 10000, MaxConnsPerIP: 1000, ReadTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, ForwardConns: 512, BodyBudget: 128 << 20}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxConns <= 0 {
		l.MaxConns = d.MaxConns
	}
	if l.MaxConnsPerIP <= 0 {
		l.MaxConnsPerIP = d.MaxConnsPerIP
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = d.ReadTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.ForwardConns <= 0 {
		l.ForwardConns = d.ForwardConns
	}
	if l.BodyBudget <= 0 {
		l.BodyBudget = d.BodyBudget
	}
	l.BodyBudget = max(l.BodyBudget, maxBodyBytes) // the largest body must fit
	return l
}

// bodyMinRate is the slowest upload a request body is given time for
// (after ReadTimeout): a 17 MiB body has 17 s more.
const bodyMinRate = 1 << 20 // bytes per second

// Fixed answers to a connection refused before any request is read: they
// are written straight to the socket, so they cannot go through writeError.
var (
	rejectTotal = fixedAnswer("503 Service Unavailable", "the node serves its most connections")
	rejectPerIP = fixedAnswer("429 Too Many Requests", "too many connections from your address")
)

// fixedAnswer is a whole HTTP answer with a too_many_connections error.
func fixedAnswer(status, message string) []byte {
	body := `{"error":{"code":"too_many_connections","message":"` + message + `"}}` + "\n"
	return []byte("HTTP/1.1 " + status + "\r\nConnection: close\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// connLimiter wraps the HTTP listener: it counts open connections in total
// and per client address, refuses those over the limits with a fixed JSON
// answer, and keeps accepting through accept errors such as EMFILE (the
// process out of file descriptors) by backing off instead of returning
// them, so that client load can never stop the server.
type connLimiter struct {
	net.Listener
	logger      *slog.Logger
	max, perIP  int
	tls         bool // the connections carry TLS: refuse without an answer
	mu          sync.Mutex
	open        int
	byIP        map[string]int
	openGauge   prometheus.GaugeFunc
	rejected    *prometheus.CounterVec
	acceptErrs  prometheus.Counter
	lastErrLogs atomic.Int64 // unix seconds of the last accept-error log line
}

func newConnLimiter(l Limits, logger *slog.Logger) *connLimiter {
	c := &connLimiter{logger: logger, max: l.MaxConns, perIP: l.MaxConnsPerIP, byIP: map[string]int{}}
	c.openGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_http_connections_open",
		Help: "Client connections open on this node."}, func() float64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return float64(c.open)
	})
	c.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mqd_http_connections_rejected_total",
		Help: "Connections refused at accept: over the total limit (total) or the per-address one (per_ip)."}, []string{"reason"})
	c.acceptErrs = prometheus.NewCounter(prometheus.CounterOpts{Name: "mqd_http_accept_errors_total",
		Help: "Accept errors (such as EMFILE) the server backed off from and survived."})
	return c
}

func (c *connLimiter) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.openGauge, c.rejected, c.acceptErrs}
}

// wrap returns ln limited by c.
func (c *connLimiter) wrap(ln net.Listener) net.Listener {
	c.Listener = ln
	return c
}

// Accept returns the next connection within the limits.
func (c *connLimiter) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil, err
			}
			// EMFILE, ENFILE, ENOBUFS, ECONNABORTED, ...: none is a reason
			// to stop serving. Back off (5 ms doubling to 1 s, as net/http
			// does) so the loop does not spin while descriptors are short.
			c.acceptErrs.Inc()
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if now := time.Now().Unix(); c.lastErrLogs.Swap(now) != now {
				c.logger.Warn("http accept failed, backing off", "err", err, "backoff", backoff)
			}
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		ip := clientIP(conn)
		if reason, answer := c.admit(ip); answer != nil {
			c.rejected.WithLabelValues(reason).Inc()
			if !c.tls { // under TLS a plain answer would be noise: just close
				_ = conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				_, _ = conn.Write(answer)
			}
			_ = conn.Close()
			continue
		}
		return &limitedConn{Conn: conn, l: c, ip: ip}, nil
	}
}

// admit counts a new connection from ip, or says why it is refused.
func (c *connLimiter) admit(ip string) (string, []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open >= c.max {
		return "total", rejectTotal
	}
	if c.byIP[ip] >= c.perIP {
		return "per_ip", rejectPerIP
	}
	c.open++
	c.byIP[ip]++
	return "", nil
}

func (c *connLimiter) release(ip string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if c.byIP[ip]--; c.byIP[ip] <= 0 {
		delete(c.byIP, ip)
	}
}

func clientIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return string(a.IP.To16())
	}
	host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	return host
}

// limitedConn is a counted connection: Close releases its slot once.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}

// SyscallConn exposes the socket, for peekSocket.
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// clientGone reports whether the client of c has closed or reset its
// connection, without consuming anything it sent: a peek that does not
// block. A parked long-poll checks it, so that a client that went away
// does not keep holding the poll.
func clientGone(c net.Conn) bool {
	p := peekSocket(c)
	return p == peekClosed || p == peekFailed
}

// peekResult is what one non-blocking peek at a socket found.
type peekResult int

const (
	peekUnknown peekResult = iota // no socket beneath the connection, or no answer
	peekEmpty                     // nothing to read: open, idle
	peekData                      // bytes to read
	peekClosed                    // the peer's orderly close (FIN)
	peekFailed                    // an error: a reset, most often
)

// peekSocket looks at the socket beneath c (TCP, or TLS over TCP) with one
// recv(MSG_PEEK|MSG_DONTWAIT), which consumes nothing. It goes through
// Control, not through the poller, whose Read would refuse at once once
// the read deadline a request left on the connection has passed (a
// parked long-poll outlives the read timeout; an idle pooled connection
// keeps its last request's deadline).
func peekSocket(c net.Conn) peekResult {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = nc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peekUnknown
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekUnknown
	}
	res := peekUnknown
	var b [1]byte
	err = rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil && n > 0:
			res = peekData
		case err == nil:
			res = peekClosed
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
			res = peekEmpty
		default:
			res = peekFailed
		}
	})
	if err != nil {
		return peekUnknown
	}
	return res
}
