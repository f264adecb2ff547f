package ops

import (
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// TestTLSOpenSSLDocs makes a CA and node certificates with the openssl
// commands of docs/security.md and runs a TLS cluster on them: the
// documented recipe works. Skipped where openssl is not installed.
func TestTLSOpenSSLDocs(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed")
	}
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	run("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "3650", "-subj", "/CN=mqd cluster CA")
	for _, n := range []string{"n1", "n2", "n3"} {
		run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
			"-keyout", n+"-key.pem", "-out", n+".csr", "-subj", "/CN="+n)
		ext := "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n"
		if err := os.WriteFile(filepath.Join(dir, n+".ext"), []byte(ext), 0o600); err != nil {
			t.Fatal(err)
		}
		run("x509", "-req", "-in", n+".csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
			"-out", n+".pem", "-days", "365", "-extfile", n+".ext")
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.pem holds no certificate")
	}
	c := tc.Start(t, 3, tc.WithHTTPS(), tc.WithClient(tc.NewTLSClient(15*time.Second, 8, pool, nil)),
		tc.WithNodeArgs(func(n *tc.Node) []string {
			return []string{"--tls-cert", filepath.Join(dir, n.ID()+".pem"), "--tls-key", filepath.Join(dir, n.ID()+"-key.pem"),
				"--tls-ca", filepath.Join(dir, "ca.pem")}
		}))
	_, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, fs[0], "t", nil)
	tc.MustPublish(t, fs[1], "t", "hello", nil)
}
