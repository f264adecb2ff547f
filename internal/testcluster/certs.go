package testcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test: it signs node
// certificates (for 127.0.0.1) with crypto/x509; nothing is checked in.
type CA struct {
	tb     testing.TB
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	der    []byte
	dir    string
	serial int64
}

// NewCA makes a CA named name, with its files under tb.TempDir().
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &CA{tb: tb, cert: cert, key: key, der: der, dir: tb.TempDir(), serial: 1}
	writePEM(tb, ca.CertPath(), "CERTIFICATE", der)
	return ca
}

// CertPath is the CA certificate's PEM file (for --tls-ca).
func (ca *CA) CertPath() string { return filepath.Join(ca.dir, "ca.pem") }

// Pool is a pool holding the CA certificate (for clients).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue signs a certificate for name, valid for 127.0.0.1 and localhost
// as a server and as a client, and writes name.pem and name-key.pem.
func (ca *CA) Issue(name string) (certPath, keyPath string) {
	ca.tb.Helper()
	certPath, keyPath = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	ca.IssueTo(name, certPath, keyPath)
	return certPath, keyPath
}

// IssueTo is Issue writing to the given files (replacing them atomically:
// a certificate rotation).
func (ca *CA) IssueTo(name, certPath, keyPath string) {
	ca.tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		ca.tb.Fatal(err)
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		ca.tb.Fatal(err)
	}
	// The key first: a node reloading between the two renames then fails
	// to pair the files and keeps its old ones, rather than pairing wrongly.
	writePEM(ca.tb, keyPath, "PRIVATE KEY", kder)
	writePEM(ca.tb, certPath, "CERTIFICATE", der)
}

// PEM is the CA certificate in PEM (to build CA bundles).
func (ca *CA) PEM() []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}) }

// KeyPair issues a certificate for name and loads it (for clients that
// present one).
func (ca *CA) KeyPair(name string) tls.Certificate {
	ca.tb.Helper()
	c, k := ca.Issue(name)
	pair, err := tls.LoadX509KeyPair(c, k)
	if err != nil {
		ca.tb.Fatal(err)
	}
	return pair
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	// Write and rename, so that a node re-reading the file on SIGHUP
	// never sees half of it.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
}

// WithTLS runs every node with the CA and a certificate of its own
// (--tls-cert, --tls-key, --tls-ca) and makes the harness speak HTTPS,
// trusting ca. Pair it with WithClient for a client with a token.
func WithTLS(ca *CA) Option {
	return func(c *config) {
		c.scheme = "https"
		c.nodeArgs = append(c.nodeArgs, func(n *Node) []string {
			cert, key := ca.Issue(n.ID())
			return []string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca.CertPath()}
		})
		if c.client == DefaultClient {
			c.client = NewTLSClient(15*time.Second, 64, ca.Pool(), nil)
		}
	}
}
