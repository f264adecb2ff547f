package test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
	"go.yaml.in/yaml/v3"
)

// authCase is one route of the matrix: who lacks the permission, who holds
// it, and the status the holder gets.
type authCase struct {
	method, path string
	body         any
	without      string // a known token without the permission ("" when every token may)
	with         string // a token with it ("" for open routes)
	want         int    // the status the right token gets
}

func authMatrix() []authCase {
	const g = "/v1/topics/orders/groups/g"
	receipts := map[string]any{"receipts": []string{"bogus"}}
	return []authCase{
		{"GET", "/metrics", nil, "pub", "monitor", 200},
		{"GET", "/v1/cluster", nil, "admin", "monitor", 200},
		{"GET", "/debug/pprof/", nil, "admin", "monitor", 200},
		{"GET", "/v1/internal/status", nil, "ops", "node", 200},
		{"POST", "/v1/internal/join", map[string]any{}, "ops", "node", 400},
		{"POST", "/v1/internal/forward", nil, "ops", "node", 400}, // an empty body
		{"DELETE", "/v1/cluster/nodes/nope", nil, "ops", "node", 404},
		{"GET", "/v1/cluster/backup", nil, "ops", "node", 200},
		{"GET", "/v1/internal/groups/g1/backup", nil, "ops", "node", 404}, // no data groups here
		{"POST", "/v1/cluster/clock/accept", nil, "ops", "node", 200},
		{"POST", "/v1/cluster/nodes/nope/drain", nil, "ops", "node", 404}, // node_not_found
		{"POST", "/v1/cluster/rebalance", nil, "ops", "node", 200},        // nothing to move: {"moves":[]}
		{"POST", "/debug/pprof/cmdline", nil, "admin", "monitor", 200},
		{"GET", "/v1/openapi.yaml", nil, "", "", 200},
		{"GET", "/ui", nil, "", "", 200},
		{"GET", "/ui/app.js", nil, "", "", 200},
		{"GET", "/v1/topics", nil, "", "pub", 200},
		{"PUT", "/v1/topics/orders.new", map[string]any{}, "pub", "admin", 201},
		{"GET", "/v1/topics/orders", nil, "other", "cons", 200},
		{"GET", "/v1/topics/orders-nonexistent", nil, "other", "pub", 404},
		{"DELETE", "/v1/topics/orders.new", nil, "cons", "admin", 200},
		{"POST", "/v1/topics/orders/messages", "m1", "cons", "pub", 201},
		{"GET", "/v1/topics/orders/messages", nil, "pub", "cons", 200},
		{"GET", "/v1/topics/orders/messages?stale=ok", nil, "pub", "cons", 200}, // a stale read is authorized all the same
		{"POST", "/v1/topics/orders/messages:batch", map[string]any{"messages": []any{map[string]any{"value": "b"}}}, "admin", "pub", 200},
		{"PUT", g, nil, "pub", "cons", 201},
		{"POST", g + "/fetch", map[string]any{"max": 1}, "pub", "cons", 200},
		{"POST", g + "/ack", receipts, "admin", "cons", 200},
		{"POST", g + "/nack", receipts, "pub", "cons", 200},
		{"POST", g + "/extend", map[string]any{"receipts": []string{"bogus"}, "lease_ms": 1000}, "other", "cons", 200},
		{"POST", g + "/process", map[string]any{"ack": []string{"bogus"}}, "pub", "cons", 409}, // stale_receipt: bogus is invalid
		{"GET", "/v1/topics/orders/keys/k1", nil, "pub", "cons", 404},                          // key_not_found
		{"POST", "/v1/topics/orders/reconcile", map[string]any{"keys": []string{"k1"}}, "admin", "cons", 200},
		{"GET", g + "/dlq", nil, "admin", "cons", 200}, // SPEC §8: listing is consume's, not admin's
		{"POST", g + "/dlq/replay", map[string]any{"all": true}, "cons", "admin", 200},
		{"DELETE", g + "/dlq/12345", nil, "cons", "admin", 404},
		{"DELETE", g, nil, "cons", "admin", 200},
		// Refusal comes before validation: a bad name or a missing topic
		// answers 403 to a token without the permission.
		{"PUT", "/v1/topics/orders..bad!", nil, "pub", "admin", 400},
		{"GET", "/v1/no-such-route", nil, "", "pub", 404},
		{"GET", "/healthz", nil, "", "", 200},
		{"GET", "/readyz", nil, "", "", 200},
	}
}

// TestAuthMatrix sends every route with no token, a wrong token, a token
// without the permission and the right token, to the leader and to a
// follower (which forwards leader routes with the caller's token).
func TestAuthMatrix(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, systest.AuthRoles)
	c := tc.StartAuth(t, 3, fx, tc.WithFlags("--pprof")) // pprof is behind its flag
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, "orders", nil)
	tc.MustTopic(t, l, "invoices", nil)
	anon := tc.NewClient(15*time.Second, 4)
	checkMatrixComplete(t, anon, l)
	for _, n := range []*tc.Node{l, fs[0]} {
		for _, ac := range authMatrix() {
			name := n.ID() + " " + ac.method + " " + ac.path
			do := func(token string) *tc.Response {
				t.Helper()
				cl := anon
				if token != "" {
					cl = anon.WithToken(token)
				}
				r, err := cl.Do(tc.CtxFor(t, 15*time.Second), ac.method, n.URL()+ac.path, ac.body, nil)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return r
			}
			if ac.with != "" {
				for _, bad := range []string{"", "mqd_wrong", fx.Secrets["node"] + "x"} {
					r := do(bad)
					systest.ExpectError(t, name+" token "+short(bad), r, 401, "unauthenticated")
					if bad != "" && strings.Contains(string(r.Body), bad) {
						t.Errorf("%s: the 401 quotes the token it was sent", name)
					}
					if got := r.Header.Get("WWW-Authenticate"); got != "Bearer" {
						t.Errorf("%s: WWW-Authenticate %q, want Bearer", name, got)
					}
				}
			}
			if ac.without != "" {
				systest.ExpectError(t, name+" token "+ac.without, do(fx.Secrets[ac.without]), 403, "forbidden")
			}
			r := do(fx.Secrets[ac.with])
			if ac.path == "/readyz" && r.Status == 503 && strings.Contains(string(r.Body), `"ready":false`) {
				continue // open all the same: a follower may be a moment behind the writes above
			}
			if r.Status != ac.want {
				t.Errorf("%s with %q: %d %s, want %d", name, ac.with, r.Status, r.Body, ac.want)
			}
		}
	}
	// The topic list shows only what a token may see.
	for token, want := range map[string]string{"pub": "orders", "other": "invoices", "ops": "invoices,orders", "monitor": ""} {
		for _, n := range []*tc.Node{l, fs[1]} {
			r, err := anon.WithToken(fx.Secrets[token]).Do(tc.CtxFor(t, 15*time.Second), "GET", n.URL()+"/v1/topics", nil, nil)
			if err != nil || r.Status != 200 {
				t.Fatalf("list as %s: %v %v", token, err, r)
			}
			var list struct {
				Topics []struct{ Name string } `json:"topics"`
			}
			if err := r.JSON(&list); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tp := range list.Topics {
				names = append(names, tp.Name)
			}
			if got := strings.Join(names, ","); got != want {
				t.Errorf("GET /v1/topics via %s as %s lists %q, want %q", n.ID(), token, got, want)
			}
		}
	}
	// Nothing secret in the logs or metrics: no token secret.
	for _, n := range c.Nodes() {
		b, err := os.ReadFile(n.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		r, err := anon.WithToken(fx.Secrets["monitor"]).Do(tc.CtxFor(t, 15*time.Second), "GET", n.URL()+"/metrics", nil, nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("metrics of %s: %v %v", n.ID(), err, r)
		}
		for name, s := range fx.Secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("node %s's log holds the secret of token %s", n.ID(), name)
			}
			if strings.Contains(string(r.Body), s) {
				t.Errorf("node %s's metrics hold the secret of token %s", n.ID(), name)
			}
		}
	}
}

func short(s string) string {
	if len(s) > 8 {
		return s[:8] + "..."
	}
	return "\"" + s + "\""
}

// TestAuthReload: SIGHUP revokes and grants tokens (one added with `mqd
// token new`), and a bad file keeps the tokens in force.
func TestAuthReload(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*"}, "node": {"cluster"}, "pub": {"publish:*"}})
	c := tc.StartAuth(t, 1, fx)
	n := c.Node(0)
	tc.MustTopic(t, n, "t", nil)
	publishAs := func(secret string) int {
		t.Helper()
		r, err := tc.DefaultClient.WithToken(secret).Do(tc.CtxFor(t, 15*time.Second), "POST", n.URL()+"/v1/topics/t/messages", "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	if st := publishAs(fx.Secrets["pub"]); st != 201 {
		t.Fatalf("pub before reload: %d", st)
	}
	// Grant with the CLI, revoke "pub" by rewriting the file.
	out, err := exec.Command(tc.Binary(t), "token", "new", "--name", "late", "--permission", "publish:t", "--auth-file", fx.Path).Output()
	if err != nil {
		t.Fatalf("mqd token new: %v", err)
	}
	late := strings.TrimSpace(string(out))
	if fi, err := os.Stat(fx.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("auth file after token new: %v %v", fi.Mode(), err)
	}
	data, _ := os.ReadFile(fx.Path)
	if strings.Contains(string(data), late) {
		t.Fatal("the auth file holds the new secret")
	}
	var f tc.TokenFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	var kept []tc.TokenEntry
	for _, e := range f.Tokens {
		if e.Name != "pub" {
			kept = append(kept, e)
		}
	}
	f.Tokens = kept
	fx.Write(t, &f)
	if st := publishAs(late); st != 401 {
		t.Fatalf("new token before SIGHUP: %d, want 401", st)
	}
	n.Reload()
	waitStatus(t, func() int { return publishAs(late) }, 201, "new token after SIGHUP")
	if st := publishAs(fx.Secrets["pub"]); st != 401 {
		t.Fatalf("revoked token after SIGHUP: %d, want 401", st)
	}
	// A bad file: the tokens in force stay, the log says why.
	if err := os.WriteFile(fx.Path, []byte(`{"tokens":[{"name":"x","sha256":"nothex"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	n.Reload()
	waitLog(t, n, "auth file not reloaded")
	if st := publishAs(late); st != 201 {
		t.Fatalf("token after a bad reload: %d, want 201", st)
	}
}

// waitStatus polls f (bounded) until it answers want.
func waitStatus(t *testing.T, f func() int, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := f()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLog polls the node's log (bounded) until it contains s.
func waitLog(t *testing.T, n *tc.Node, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(n.LogPath())
		if strings.Contains(string(b), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: log never said %q", n.ID(), s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAuthProtectedMode: without --auth-file, mqd refuses a non-loopback
// --http-addr unless --insecure.
func TestAuthProtectedMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(tc.Binary(t), "--data-dir", filepath.Join(dir, "d"), "--http-addr", "0.0.0.0:0", "--raft-addr", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--auth-file") {
		t.Fatalf("started openly on 0.0.0.0: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); err == nil {
		t.Fatal("refused start created the data dir")
	}
	// With --insecure it starts (and answers on loopback).
	c := tc.Start(t, 1, tc.WithNodeArgs(func(n *tc.Node) []string {
		return []string{"--http-addr", "0.0.0.0:" + strings.Split(n.HTTPAddr(), ":")[1], "--insecure"}
	}))
	r, err := c.Node(0).Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/topics", nil, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("insecure node: %v %v", err, r)
	}
}

// checkMatrixComplete fails the test if a route of the node's OpenAPI
// document (which a unit test keeps equal to the route table) has no case
// in authMatrix.
func checkMatrixComplete(t *testing.T, cl *tc.Client, n *tc.Node) {
	t.Helper()
	r, err := cl.Do(tc.CtxFor(t, 15*time.Second), "GET", n.URL()+"/v1/openapi.yaml", nil, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("openapi.yaml: %v %v", err, r)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(r.Body, &doc); err != nil {
		t.Fatal(err)
	}
	matrix := authMatrix()
	for pattern, ops := range doc.Paths {
		for method := range ops {
			m := strings.ToUpper(method)
			if !slices.Contains([]string{"GET", "PUT", "POST", "DELETE", "PATCH"}, m) {
				continue
			}
			if !slices.ContainsFunc(matrix, func(ac authCase) bool { return ac.method == m && pathMatches(pattern, ac.path) }) {
				t.Errorf("route %s %s has no case in the auth matrix", m, pattern)
			}
		}
	}
}

// pathMatches reports whether path fits an OpenAPI path pattern: {x}
// stands for one segment, a final {x} also for the rest (pprof, /ui files).
func pathMatches(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i, p := range ps {
		if i >= len(xs) {
			return false
		}
		if strings.HasPrefix(p, "{") {
			if i == len(ps)-1 {
				return true
			}
			continue
		}
		if p != xs[i] {
			return false
		}
	}
	return len(ps) == len(xs)
}

// TestHUPWhileStarting: a SIGHUP that arrives while the node is still
// starting (after it has read its token file, before it serves) neither
// kills it nor is lost.
func TestHUPWhileStarting(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor"}})
	dir := t.TempDir()
	logPath := filepath.Join(dir, "log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd := exec.Command(tc.Binary(t), "--data-dir", filepath.Join(dir, "d"), "--http-addr", "127.0.0.1:0",
		"--raft-addr", "127.0.0.1:0", "--auth-file", fx.Path)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed when the process has been reaped
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "auth: tokens loaded") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never loaded its tokens:\n%s", b)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("SIGHUP during start ended the node: %v\n%s", waitErr, b)
		default:
		}
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "SIGHUP: auth file reloaded") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SIGHUP was never handled:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A node started with a node token the cluster does not accept is never
// added, and says why in its log instead of retrying in silence: after
// about 10 s a warning names the refusal of its status calls.
func TestJoinWithWrongNodeTokenWarns(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, systest.AuthRoles)
	c := tc.StartAuth(t, 1, fx, tc.WithNodeArgs(func(n *tc.Node) []string {
		if n.ID() == "n2" {
			return []string{"--node-token", "not-the-node-token"}
		}
		return nil
	}))
	ctx := tc.CtxFor(t, 90*time.Second)
	n2 := c.AddNode("n2")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(n2.LogPath())
		if log := string(b); strings.Contains(log, "not in the cluster state yet") {
			if !strings.Contains(log, "status 401") {
				t.Fatalf("the warning does not name the refusal (status 401):\n%s", log)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warning within 30 s from a node whose token the cluster refuses:\n%s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ci, err := c.Node(0).Cluster(ctx)
	if err != nil || len(ci.Nodes) != 1 {
		t.Fatalf("the cluster after the refused join: %+v %v, want its one node", ci, err)
	}
	// It never heard from a leader (-1, not 0 as a leader says), and is not
	// ready: 503 with Retry-After, as every 503.
	nodeClient := tc.NewClient(10*time.Second, 2).WithToken(fx.Secrets["node"])
	r, err := nodeClient.Do(ctx, http.MethodGet, n2.URL()+"/v1/internal/status", nil, nil)
	var st struct {
		LastContactMs *int64 `json:"last_contact_ms"`
	}
	if err != nil || r.Status != 200 || r.JSON(&st) != nil || st.LastContactMs == nil || *st.LastContactMs != -1 {
		t.Fatalf("status of the node that never joined: %v %v, want last_contact_ms -1", r, err)
	}
	r, err = n2.Do(ctx, http.MethodGet, "/readyz", nil, nil)
	if err != nil || r.Status != 503 || r.Header.Get("Retry-After") != "1" || !strings.Contains(string(r.Body), "no leader known") {
		t.Fatalf("/readyz of the node that never joined: %v %v, want 503 with Retry-After: 1 and the reason (no leader known)", r, err)
	}
}
