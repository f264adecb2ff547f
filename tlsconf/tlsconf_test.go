package tlsconf

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

func TestLoadAndReload(t *testing.T) {
	ca := tc.NewCA(t, "ca")
	cert, key := ca.Issue("n1")
	if _, err := Load(Files{Cert: cert, Key: key}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Load without CA = %v", err)
	}
	s, err := Load(Files{Cert: cert, Key: key, CA: ca.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	before := s.cur.Load().cert
	// A key that does not pair with the certificate: the old pair stays.
	other := tc.NewCA(t, "other")
	_, otherKey := other.Issue("x")
	data, _ := os.ReadFile(otherKey)
	if err := os.WriteFile(key, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Reload(mismatched key) = %v", err)
	}
	if s.cur.Load().cert != before {
		t.Fatal("a bad reload replaced the certificate")
	}
	// A new pair loads.
	ca.IssueTo("n1", cert, key)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.cur.Load().cert == before {
		t.Fatal("reload kept the old certificate")
	}
}

// TestMutualTLS: the listener requires a certificate of the CA; the dialer
// presents one and verifies the server.
func TestMutualTLS(t *testing.T) {
	ca, other := tc.NewCA(t, "ca"), tc.NewCA(t, "other")
	c1, k1 := ca.Issue("a")
	srv, err := Load(Files{Cert: c1, Key: k1, CA: ca.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := srv.Listener(raw, tls.RequireAndVerifyClientCert, 2*time.Second)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				if _, err := c.Read(b); err == nil {
					c.Write(b)
				}
			}()
		}
	}()
	roundTrip := func(s *Store) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := s.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte{7}); err != nil {
			return err
		}
		_, err = c.Read(make([]byte, 1))
		return err
	}
	c2, k2 := ca.Issue("b")
	good, err := Load(Files{Cert: c2, Key: k2, CA: ca.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(good); err != nil {
		t.Fatalf("same CA: %v", err)
	}
	// A client of another CA that trusts the server: refused by the server.
	c3, k3 := other.Issue("c")
	os.WriteFile(other.CertPath()+".both", append(other.PEM(), ca.PEM()...), 0o600)
	bad, err := Load(Files{Cert: c3, Key: k3, CA: other.CertPath() + ".both"})
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(bad); err == nil {
		t.Fatal("a certificate of another CA got through")
	}
	// A client that trusts only another CA: it refuses the server.
	c4, k4 := other.Issue("d")
	lone, err := Load(Files{Cert: c4, Key: k4, CA: other.CertPath()})
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(lone); err == nil {
		t.Fatal("dialer accepted a server of another CA")
	}
}
