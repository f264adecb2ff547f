package ops

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// tlsArgs replaces a node's --tls-* flags.
func tlsArgs(args []string, cert, key, ca string) []string {
	out := append([]string(nil), args...)
	for i := 0; i+1 < len(out); i++ {
		switch out[i] {
		case "--tls-cert":
			out[i+1] = cert
		case "--tls-key":
			out[i+1] = key
		case "--tls-ca":
			out[i+1] = ca
		}
	}
	return out
}

func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

// TestTLSCluster: a three-node cluster with TLS (and tokens, nodes
// authenticating to each other by certificate only) forms, serves through
// every node, and fails over; a plain-HTTP client gets nothing.
func TestTLSCluster(t *testing.T) {
	t.Parallel()
	ca := tc.NewCA(t, "cluster-ca")
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*", "publish:*", "consume:*"}})
	cl := tc.NewTLSClient(15*time.Second, 16, ca.Pool(), nil).WithToken(fx.Secrets["ops"])
	c := tc.Start(t, 3, tc.WithTLS(ca), tc.WithClient(cl), tc.WithFlags("--auth-file", fx.Path))
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, fs[0], "t", nil) // forwarded to the leader over mutual TLS
	for i, n := range c.Nodes() {
		tc.MustPublish(t, n, "t", fmt.Sprintf("m%d", i), nil)
	}
	// Plain HTTP gets no HTTP answer from any node.
	for _, n := range c.Nodes() {
		r, err := tc.NewClient(3*time.Second, 1).Do(tc.CtxFor(t, 5*time.Second), "GET", "http://"+n.HTTPAddr()+"/healthz", nil, nil)
		if err == nil {
			t.Fatalf("plain HTTP to %s answered %d %q", n.ID(), r.Status, r.Body)
		}
	}
	l.Kill()
	nl := tc.MustLeader(t, c)
	if nl == l {
		t.Fatal("killed leader still leads")
	}
	if _, err := systest.PublishRetry(tc.CtxFor(t, 30*time.Second), c.Live(), "t", "after-failover"); err != nil {
		t.Fatal(err)
	}
	l.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if _, err := systest.PollStats(tc.CtxFor(t, 20*time.Second), n, "t", func(s tc.TopicStats) bool { return s.Messages == 4 }); err != nil {
			t.Fatal(err)
		}
	}
	// A path that a normalizing forward would turn into another route:
	// through a follower, with a token that lacks cluster, it must not
	// reach node removal (it did: the follower authorized a dead letter's
	// deletion, the leader saw DELETE /v1/cluster/nodes/{id} and took the
	// follower's certificate for the caller).
	l, fs = tc.MustRoles(t, c)
	victim := fs[1].ID()
	if r, err := fs[0].Do(tc.CtxFor(t, 15*time.Second), "DELETE", "/v1/cluster/nodes/"+victim, nil, nil); err != nil || r.Status != 403 {
		t.Fatalf("node removal with a token without cluster: %v %v, want 403", r, err)
	}
	sneaky := "/v1/topics/t/groups/g/dlq/..%2F..%2F..%2F..%2F..%2Fcluster%2Fnodes%2F" + victim
	r, err := fs[0].Do(tc.CtxFor(t, 15*time.Second), "DELETE", sneaky, nil, nil)
	if err != nil || r.Status == 200 {
		t.Fatalf("DELETE %s through follower %s: %v %v, want a refusal", sneaky, fs[0].ID(), r, err)
	}
	if ci, err := l.Cluster(tc.CtxFor(t, 10*time.Second)); err != nil || len(ci.Nodes) != 3 {
		t.Fatalf("after the crafted path the cluster has %v (%v), want 3 members", ci, err)
	}
	// The command line trusts --tls-ca and sends --token.
	cli := func(args ...string) (string, error) {
		out, err := exec.Command(tc.Binary(t), args...).CombinedOutput()
		return string(out), err
	}
	base := []string{"--server", l.URL(), "--token", fx.Secrets["ops"]}
	if out, err := cli(append([]string{"topic", "list"}, append(base, "--tls-ca", ca.CertPath())...)...); err != nil || !strings.Contains(out, "t") {
		t.Fatalf("mqd topic list over TLS: %v\n%s", err, out)
	}
	if out, err := cli(append([]string{"topic", "list"}, base...)...); err == nil {
		t.Fatalf("mqd topic list without --tls-ca trusted the cluster's CA:\n%s", out)
	}
	// Nodes joined by certificate: no token was needed for it.
	for _, n := range c.Nodes() {
		b, _ := os.ReadFile(n.LogPath())
		if strings.Contains(string(b), fx.Secrets["ops"]) {
			t.Errorf("node %s's log holds a token", n.ID())
		}
	}
}

// TestTLSForeignCA: certificates of another CA open nothing: no HTTPS
// handshake with a foreign client certificate, no join without one, no raft
// connection; a member restarted with a foreign certificate receives no
// more log entries until it has the cluster's again. With data groups the
// topic's group's raft connections, on the same port, are refused alike,
// and the member restarted is the group's leader: a forward to it that
// fails its TLS handshake sent nothing and is sent again once another
// member leads (it answered 503 "may or may not have taken effect").
func TestTLSForeignCA(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, tlsForeignCA)
}

func tlsForeignCA(t *testing.T, opts ...tc.Option) {
	ca, other := tc.NewCA(t, "cluster-ca"), tc.NewCA(t, "other-ca")
	c := tc.Start(t, 3, append(opts, tc.WithTLS(ca))...)
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, "t", nil)
	tc.MustPublish(t, l, "t", "before", nil)
	g := systest.TopicGroup(t, l, "t")
	if g != "default" {
		// The member restarted with a foreign certificate is the topic's
		// group's leader: the others go on forwarding to it until they
		// learn it no longer leads.
		gl, _ := systest.PlacedRoles(t, c, "t")
		var others []*tc.Node
		for _, n := range c.Nodes() {
			if n != gl {
				others = append(others, n)
			}
		}
		l, fs = others[0], []*tc.Node{gl, others[1]}
	}

	// HTTPS with a client certificate of the other CA: the handshake fails.
	foreign := other.KeyPair("rogue")
	rogue := tc.NewTLSClient(5*time.Second, 1, ca.Pool(), &foreign)
	join := map[string]any{"id": "rogue", "http_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2"}
	if r, err := rogue.Do(tc.CtxFor(t, 10*time.Second), "POST", l.URL()+"/v1/internal/join", join, nil); err == nil {
		t.Fatalf("join with a foreign certificate answered %d %s", r.Status, r.Body)
	}
	// Without a client certificate: 401 on node-to-node routes.
	anon := tc.NewTLSClient(5*time.Second, 1, ca.Pool(), nil)
	for _, p := range []string{"/v1/internal/join", "/v1/internal/status"} {
		m := "GET"
		var body any
		if strings.HasSuffix(p, "join") {
			m, body = "POST", join
		}
		r, err := anon.Do(tc.CtxFor(t, 10*time.Second), m, l.URL()+p, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		systest.ExpectError(t, p+" without a certificate", r, 401, "unauthenticated")
	}
	// The cluster routes operators call are open without --auth-file, as
	// everything else is: node removal and backup need no certificate.
	if r, err := anon.Do(tc.CtxFor(t, 10*time.Second), "DELETE", l.URL()+"/v1/cluster/nodes/nope", nil, nil); err != nil {
		t.Fatal(err)
	} else {
		systest.ExpectError(t, "node removal without a certificate", r, 404, "node_not_found")
	}
	if r, err := anon.Do(tc.CtxFor(t, 10*time.Second), "GET", l.URL()+"/v1/cluster/backup", nil, nil); err != nil || r.Status != 200 {
		t.Fatalf("backup without a certificate: %v %v, want 200", r, err)
	}
	// Raft: a foreign certificate gets no connection.
	if err := raftHandshake(l.RaftAddr(), ca.Pool(), &foreign); err == nil {
		t.Fatal("raft accepted a certificate of another CA")
	}
	if err := raftHandshake(l.RaftAddr(), ca.Pool(), nil); err == nil {
		t.Fatal("raft accepted a connection without a certificate")
	}

	// A follower restarted with a certificate of the other CA.
	f := fs[0]
	orig := f.Args()
	cert, key := other.Issue("f-foreign")
	f.Kill()
	f.SetArgs(tlsArgs(orig, cert, key, other.CertPath()))
	f.Restart()
	fview := tc.NewTLSClient(5*time.Second, 1, other.Pool(), nil)
	for i := range 5 {
		tc.MustPublish(t, l, "t", fmt.Sprintf("while-foreign-%d", i), nil)
	}
	want, err := l.Cluster(tc.CtxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Give it time it would need to catch up (heartbeats are 1.5 s).
	time.Sleep(4 * time.Second)
	r, err := fview.Do(tc.CtxFor(t, 10*time.Second), "GET", f.URL()+"/v1/cluster", nil, nil)
	if err != nil {
		t.Fatalf("foreign node's own view: %v", err)
	}
	var got tc.ClusterInfo
	if err := r.JSON(&got); err != nil {
		t.Fatal(err)
	}
	if got.AppliedIndex >= want.AppliedIndex && g == "default" {
		t.Fatalf("node with a foreign certificate applied %d, the leader %d: it received the log", got.AppliedIndex, want.AppliedIndex)
	}
	if g != "default" { // the publishes went to the topic's data group
		r, err := fview.Do(tc.CtxFor(t, 10*time.Second), "GET", f.URL()+"/metrics", nil, nil)
		if err != nil {
			t.Fatalf("foreign node's own metrics: %v", err)
		}
		prefix := `mqd_raft_applied_index{raft_group="` + g + `"} `
		fa := -1.0
		for _, line := range strings.Split(string(r.Body), "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				fa, _ = strconv.ParseFloat(v, 64)
			}
		}
		if fa < 0 {
			t.Fatalf("node with a foreign certificate reports no replica of data group %s", g)
		}
		var most uint64
		for _, n := range []*tc.Node{l, fs[1]} {
			most = max(most, systest.GroupApplied(t, n, g))
		}
		if uint64(fa) >= most {
			t.Fatalf("node with a foreign certificate applied %.0f in data group %s, the others up to %d: it received the log", fa, g, most)
		}
	}
	b, _ := os.ReadFile(f.LogPath())
	if !strings.Contains(string(b), "certificate") {
		t.Errorf("node %s's log does not mention the refused certificate", f.ID())
	}
	// Back with the cluster's certificate, it catches up.
	f.Kill()
	f.SetArgs(orig)
	f.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := systest.PollStats(tc.CtxFor(t, 20*time.Second), f, "t", func(s tc.TopicStats) bool { return s.Messages == 6 }); err != nil {
		t.Fatal(err)
	}
}

// raftHandshake dials a raft port with TLS and tries one round trip: the
// server verifies client certificates after the client's handshake ends,
// so a refusal shows on the first read.
func raftHandshake(addr string, roots *x509.CertPool, cert *tls.Certificate) error {
	cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	// A raft RPC type byte the server will wait on: any read error or
	// EOF means the server hung up.
	if _, err := c.Write([]byte{0}); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil // the server waits for the rest of an RPC: accepted
	}
	if err == io.EOF {
		return fmt.Errorf("refused: %w", err)
	}
	return err
}

// TestTLSRotation: a new CA and new certificates are rolled out with SIGHUP
// (CA bundle, then certificates, then the new CA alone) while the cluster
// keeps serving; afterwards it fails over on the new certificates only.
func TestTLSRotation(t *testing.T) {
	t.Parallel()
	oldCA, newCA := tc.NewCA(t, "old-ca"), tc.NewCA(t, "new-ca")
	both := x509.NewCertPool()
	both.AddCert(mustParse(t, oldCA.PEM()))
	both.AddCert(mustParse(t, newCA.PEM()))
	cl := tc.NewTLSClient(15*time.Second, 16, both, nil)
	c := tc.Start(t, 3, tc.WithTLS(oldCA), tc.WithClient(cl))
	l := tc.MustLeader(t, c)
	tc.MustTopic(t, l, "t", nil)
	published := 0
	serve := func(step string) {
		t.Helper()
		for _, n := range c.Nodes() {
			tc.MustPublish(t, n, "t", fmt.Sprintf("%s-%s", step, n.ID()), nil)
			published++
		}
	}
	serve("start")
	reloads := 0
	hupAll := func(step string) {
		t.Helper()
		reloads++
		for _, n := range c.Nodes() {
			n.Reload()
		}
		for _, n := range c.Nodes() {
			waitLogCount(t, n, "SIGHUP: certificates reloaded", reloads)
		}
		serve(step)
	}
	bundle := append(oldCA.PEM(), newCA.PEM()...)
	setCA := func(pemData []byte) {
		t.Helper()
		for _, n := range c.Nodes() {
			p := flagValue(n.Args(), "--tls-ca")
			if err := os.WriteFile(p+".tmp", pemData, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p+".tmp", p); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Every node's --tls-ca is the same file: the old CA's.
	setCA(bundle)
	hupAll("bundle")
	for _, n := range c.Nodes() {
		newCA.IssueTo(n.ID(), flagValue(n.Args(), "--tls-cert"), flagValue(n.Args(), "--tls-key"))
	}
	hupAll("new-certs")
	setCA(newCA.PEM())
	hupAll("new-ca")

	// New connections see only the new CA's certificates.
	onlyNew := tc.NewTLSClient(5*time.Second, 1, newCA.Pool(), nil)
	for _, n := range c.Nodes() {
		if r, err := onlyNew.Do(tc.CtxFor(t, 10*time.Second), "GET", n.URL()+"/healthz", nil, nil); err != nil || r.Status != 200 {
			t.Fatalf("%s with the new CA: %v", n.ID(), err)
		}
		onlyOld := tc.NewTLSClient(5*time.Second, 1, oldCA.Pool(), nil)
		if _, err := onlyOld.Do(tc.CtxFor(t, 10*time.Second), "GET", n.URL()+"/healthz", nil, nil); err == nil {
			t.Fatalf("%s still serves the old certificate", n.ID())
		}
	}
	// Fail over: the new leader dials its peers with the new certificates.
	l = tc.MustLeader(t, c)
	l.Kill()
	if nl := tc.MustLeader(t, c); nl == l {
		t.Fatal("killed leader still leads")
	}
	if _, err := systest.PublishRetry(tc.CtxFor(t, 30*time.Second), c.Live(), "t", "after-failover"); err != nil {
		t.Fatal(err)
	}
	published++
	l.Restart()
	if _, err := c.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if _, err := systest.PollStats(tc.CtxFor(t, 20*time.Second), n, "t", func(s tc.TopicStats) bool { return s.Messages == int64(published) }); err != nil {
			t.Fatal(err)
		}
	}
}

func mustParse(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(pemData)
	if b == nil {
		t.Fatal("bad PEM")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitLogCount polls the node's log (bounded) until s appears k times.
func waitLogCount(t *testing.T, n *tc.Node, s string, k int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(n.LogPath())
		if strings.Count(string(b), s) >= k {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: log said %q fewer than %d times", n.ID(), s, k)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
