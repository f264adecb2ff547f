// Package tlsconf holds a node's TLS material (--tls-cert, --tls-key,
// --tls-ca) and hands out tls.Configs that always use the material loaded
// last, so that SIGHUP rotates certificates without a restart: connections
// made after a reload use the new files, established ones stay as they are.
//
// It does not decide who may do what (package auth and the api's routes
// do); it only says whether a peer holds a certificate of the cluster's CA.
package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Files are the PEM files of a node: its certificate (chain), its key,
// and the CA certificates it trusts for peers.
type Files struct {
	Cert, Key, CA string
}

// ErrInvalid is TLS material that cannot be used.
var ErrInvalid = errors.New("invalid TLS files")

type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

// Store is the current TLS material; Reload swaps it atomically.
type Store struct {
	files Files
	cur   atomic.Pointer[material]
}

// Load reads the files.
func Load(f Files) (*Store, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, fmt.Errorf("%w: --tls-cert, --tls-key and --tls-ca go together", ErrInvalid)
	}
	s := &Store{files: f}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the files; on error the material loaded before stays.
func (s *Store) Reload() error {
	cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
	if err != nil {
		return fmt.Errorf("%w: certificate %s / key %s: %w", ErrInvalid, s.files.Cert, s.files.Key, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("%w: certificate %s: %w", ErrInvalid, s.files.Cert, err)
		}
	}
	if time.Now().After(cert.Leaf.NotAfter) {
		return fmt.Errorf("%w: certificate %s expired on %s", ErrInvalid, s.files.Cert, cert.Leaf.NotAfter.Format(time.RFC3339))
	}
	pem, err := os.ReadFile(s.files.CA)
	if err != nil {
		return fmt.Errorf("%w: CA: %w", ErrInvalid, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%w: CA %s holds no PEM certificate", ErrInvalid, s.files.CA)
	}
	s.cur.Store(&material{cert: &cert, pool: pool})
	return nil
}

// NotAfter is when the current certificate expires.
func (s *Store) NotAfter() time.Time { return s.cur.Load().cert.Leaf.NotAfter }

// ServerConfig serves with the current certificate. clientAuth says what
// it asks of clients: tls.RequireAndVerifyClientCert for Raft,
// tls.VerifyClientCertIfGiven for the HTTP API (users send tokens; nodes
// present their certificates). Each handshake uses the material current then.
func (s *Store) ServerConfig(clientAuth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   clientAuth,
			}, nil
		},
	}
}

// ClientConfig dials serverName presenting the current certificate and
// trusting only the current CA.
func (s *Store) ClientConfig(serverName string) *tls.Config {
	m := s.cur.Load()
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    m.pool,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return m.cert, nil
		},
	}
}

// DialContext opens a mutual-TLS connection to addr (host:port) and
// completes the handshake within ctx.
func (s *Store) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{KeepAlive: 30 * time.Second}, Config: s.ClientConfig(host)}
	return d.DialContext(ctx, network, addr)
}

// DialTimeout is DialContext bounded by timeout.
func (s *Store) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.DialContext(ctx, "tcp", addr)
}

// Listener wraps a listener in TLS with ServerConfig(clientAuth). The
// handshake happens on a connection's first read or write, bounded by
// handshakeTimeout, so a client that never completes it holds nothing
// longer than that.
func (s *Store) Listener(ln net.Listener, clientAuth tls.ClientAuthType, handshakeTimeout time.Duration) net.Listener {
	return &listener{Listener: ln, cfg: s.ServerConfig(clientAuth), timeout: handshakeTimeout}
}

type listener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: tls.Server(c, l.cfg), timeout: l.timeout}, nil
}

// conn completes its handshake, bounded by timeout, before its first read
// or write. The bound is a context, not a deadline, so the deadlines its
// user sets (fasthttp's read timeout) stay in force.
type conn struct {
	*tls.Conn
	timeout time.Duration
	once    sync.Once
	err     error
}

func (c *conn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		c.err = c.Conn.HandshakeContext(ctx)
	})
	return c.err
}

func (c *conn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *conn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// ConnectionState is the TLS state (fasthttp reads it for client certificates).
func (c *conn) ConnectionState() tls.ConnectionState { return c.Conn.ConnectionState() }
