package ops

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// Every client command through the real binary against a real node: what
// it prints on success, and its exit status and message on failure.
func TestCLI(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	srv := c.Node(0).URL()

	t.Run("topic", func(t *testing.T) {
		systest.MustContain(t, "create", systest.OK(t, srv, "", "topic", "create", "orders", "--partitions", "3"), "created topic orders (3 partitions)")
		systest.MustContain(t, "update", systest.OK(t, srv, "", "topic", "create", "orders", "--config", `{"max_retry":2}`), "updated topic orders")
		systest.Fails(t, srv, 1, "partitions_shrink", "topic", "create", "orders", "--partitions", "1")
		// An explicit 0 is sent and refused like any out-of-range count.
		systest.Fails(t, srv, 1, "invalid_config", "topic", "create", "zero", "--partitions", "0")
		systest.Fails(t, srv, 1, "topic_not_found", "topic", "info", "zero")
		systest.Fails(t, srv, 1, "max_retyr", "topic", "create", "orders", "--config", `{"max_retyr":2}`)
		systest.Fails(t, srv, 2, "--config", "topic", "create", "orders", "--config", `[1]`)
		systest.Fails(t, srv, 1, "invalid_name", "topic", "create", "x!y")
		systest.MustContain(t, "list", systest.OK(t, srv, "", "topic", "list"), "TOPIC", "orders  3")
		info := systest.OK(t, srv, "", "topic", "info", "orders")
		systest.MustContain(t, "info", info, "max_retry          2", "PARTITION", "ack_timeout_ms")
		var st struct {
			Name   string
			Config map[string]any
		}
		if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "topic", "info", "orders", "--json")), &st); err != nil ||
			st.Name != "orders" || st.Config["max_retry"] != 2.0 {
			t.Errorf("topic info --json: %+v %v", st, err)
		}
		systest.Fails(t, srv, 1, "topic_not_found", "topic", "info", "nope")
		systest.Fails(t, srv, 2, "NAME", "topic", "info")
		systest.OK(t, srv, "", "topic", "create", "gone")
		systest.MustContain(t, "delete", systest.OK(t, srv, "", "topic", "delete", "gone"), "deleted topic gone")
		systest.Fails(t, srv, 1, "topic_not_found", "topic", "delete", "gone")
	})

	t.Run("pub-sub", func(t *testing.T) {
		systest.OK(t, srv, "", "topic", "create", "ps")
		// g2 exists before g acks anything: with retention_ms 0 the leader
		// trims what every group finished, and a g2 created later (its
		// cursor at the head) could miss the first message.
		r, err := c.Node(0).Do(tc.CtxFor(t, 15*time.Second), "PUT", "/v1/topics/ps/groups/g2", nil, nil)
		if err == nil {
			err = r.Expect(201)
		}
		if err != nil {
			t.Fatalf("create group g2: %v", err)
		}
		systest.MustContain(t, "pub", systest.OK(t, srv, "", "pub", "ps", "hello", "--key", "k1", "--attr", "src=cli"), "ps partition 0 offset 0\n")
		systest.MustContain(t, "pub dup", systest.OK(t, srv, "", "pub", "ps", "--key", "k1", "hello again"), "offset 0 duplicate")
		systest.MustContain(t, "stdin", systest.OK(t, srv, "one\ntwo\n\nthree\n", "pub", "ps", "--key", "lines"), "offset 1\n", "offset 3\n")
		// The same lines again: every line's key (lines-N) is a duplicate.
		if out := systest.OK(t, srv, "one\ntwo\n\nthree\n", "pub", "ps", "--key", "lines"); strings.Count(out, "duplicate") != 3 {
			t.Errorf("stdin again: %q, want three duplicates", out)
		}
		file := filepath.Join(t.TempDir(), "msgs.txt")
		if err := os.WriteFile(file, []byte("four\nfive\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		systest.MustContain(t, "file", systest.OK(t, srv, "", "pub", "ps", "--file", file), "offset 4\n", "offset 5\n")
		var pr struct{ Offset int }
		if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "pub", "ps", "six", "--partition-key", "p", "--json")), &pr); err != nil || pr.Offset != 6 {
			t.Errorf("pub --json: %+v %v", pr, err)
		}
		systest.OK(t, srv, "", "pub", "ps", "later", "--delay", "1h")
		systest.Fails(t, srv, 1, "topic_not_found", "pub", "nope", "x")
		systest.Fails(t, srv, 2, "name=value", "pub", "ps", "x", "--attr", "novalue")
		systest.Fails(t, srv, 2, "no message", "pub", "ps")

		if out := systest.OK(t, srv, "", "sub", "ps", "--group", "g", "--count", "2"); out != "hello\none\n" {
			t.Errorf("sub --count 2: %q", out)
		}
		// --json: one message object per line, with its attributes.
		out := systest.OK(t, srv, "", "sub", "ps", "--group", "g2", "--count", "1", "--json")
		var m struct {
			Offset         int
			IdempotencyKey string `json:"idempotency_key"`
			Attrs          map[string]string
		}
		if err := json.Unmarshal([]byte(out), &m); err != nil || m.IdempotencyKey != "k1" || m.Attrs["src"] != "cli" {
			t.Errorf("sub --json: %q (%v)", out, err)
		}
		// Without --count it takes the rest (the delayed one stays) and stops after --wait.
		if out := systest.OK(t, srv, "", "sub", "ps", "--group", "g", "--wait", "500ms"); out != "two\nthree\nfour\nfive\nsix\n" {
			t.Errorf("sub rest: %q", out)
		}
		if out := systest.OK(t, srv, "", "sub", "ps", "--group", "g", "--wait", "0"); out != "" {
			t.Errorf("sub on a drained group: %q", out)
		}
		var st struct {
			Groups map[string]struct {
				Acked    int
				InFlight int `json:"in_flight"`
			}
		}
		if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "topic", "info", "ps", "--json")), &st); err != nil ||
			st.Groups["g"].Acked != 7 || st.Groups["g"].InFlight != 0 {
			t.Errorf("group g after sub: %+v (%v), want all 7 printed messages acked", st.Groups["g"], err)
		}
		// --no-ack leaves it leased (in flight); --nack makes it wait for a retry.
		systest.OK(t, srv, "", "sub", "ps", "--group", "g3", "--count", "1", "--no-ack")
		systest.OK(t, srv, "", "sub", "ps", "--group", "g4", "--count", "1", "--nack", "not today")
		info := systest.OK(t, srv, "", "topic", "info", "ps")
		if !regexp.MustCompile(`\ng3 +\d+ +1 `).MatchString(info) || !regexp.MustCompile(`\ng4 +\d+ +0 +[12] `).MatchString(info) {
			t.Errorf("after --no-ack (g3: 1 in flight) and --nack (g4: the nacked one delayed):\n%s", info)
		}
		// --follow waits past --wait for a message published later.
		followed := make(chan systest.CliRun, 1)
		go func() {
			followed <- systest.RunCLI(t, srv, "", "sub", "ps", "--group", "g", "--follow", "--count", "1", "--wait", "100ms")
		}()
		time.Sleep(1500 * time.Millisecond) // well past --wait: without --follow it has returned
		systest.OK(t, srv, "", "pub", "ps", "followed")
		select {
		case r := <-followed:
			if r.Code != 0 || r.Stdout != "followed\n" {
				t.Errorf("sub --follow: exit %d, %q, %q", r.Code, r.Stdout, r.Stderr)
			}
		case <-time.After(30 * time.Second):
			t.Error("sub --follow --count 1 did not return within 30 s of the publish")
		}
		systest.Fails(t, srv, 2, "--group is required", "sub", "ps")
		systest.Fails(t, srv, 1, "topic_not_found", "sub", "nope", "--group", "g")
	})

	t.Run("dlq", func(t *testing.T) {
		systest.OK(t, srv, "", "topic", "create", "dl", "--config", `{"max_retry":0}`)
		systest.OK(t, srv, "", "pub", "dl", "poison", "--key", "p1")
		systest.OK(t, srv, "", "sub", "dl", "--group", "g", "--nack", "cannot parse")
		list := systest.OK(t, srv, "", "dlq", "list", "dl", "g")
		systest.MustContain(t, "dlq list", list, "ID", "p1", "cannot parse", "nack")
		var page struct {
			DeadLetters []struct{ ID uint64 } `json:"dead_letters"`
		}
		if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "dlq", "list", "dl", "g", "--json")), &page); err != nil || len(page.DeadLetters) != 1 {
			t.Fatalf("dlq list --json: %+v %v", page, err)
		}
		systest.MustContain(t, "replay", systest.OK(t, srv, "", "dlq", "replay", "dl", "g", "--id", "1"), "replaying 1 dead letter")
		if out := systest.OK(t, srv, "", "sub", "dl", "--group", "g", "--count", "1", "--wait", "10s", "--nack", "still broken"); out != "poison\n" {
			t.Errorf("after replay: %q", out)
		}
		// --json prints the API's answer, rate_per_sec included.
		var rr map[string]any
		if out := systest.OK(t, srv, "", "dlq", "replay", "dl", "g", "--all", "--rate", "10", "--json"); json.Unmarshal([]byte(out), &rr) != nil ||
			rr["accepted"] != 1.0 || rr["rate_per_sec"] != 10.0 {
			t.Errorf("dlq replay --json: %q, want the API's {\"accepted\":1,\"rate_per_sec\":10}", out)
		}
		systest.Fails(t, srv, 2, "--all or --id", "dlq", "replay", "dl", "g")
		systest.Fails(t, srv, 1, "dead_letter_not_found", "dlq", "delete", "dl", "g", "999")
		systest.Fails(t, srv, 2, "positive integer", "dlq", "delete", "dl", "g", "x")
		systest.Fails(t, srv, 1, "group_not_found", "dlq", "list", "dl", "nogroup")
	})

	t.Run("cluster", func(t *testing.T) {
		systest.MustContain(t, "status", systest.OK(t, srv, "", "cluster", "status"), "leader n1", "ID", "n1", "leader  ",
			"state format ", "READS FORMAT", fmt.Sprint("<= ", fsm.StateFormat))
		var st struct{ Leader struct{ ID string } }
		if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "cluster", "status", "--json")), &st); err != nil || st.Leader.ID != "n1" {
			t.Errorf("cluster status --json: %+v %v", st, err)
		}
		systest.Fails(t, srv, 1, "node_not_found", "cluster", "remove", "no-such-node")
		// A second node joins; cluster remove takes it out again.
		n2 := c.AddNode("n2")
		if err := n2.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
			t.Fatalf("n2 not ready: %v", err)
		}
		systest.MustContain(t, "status with n2", systest.OK(t, srv, "", "cluster", "status"), "\nn2 ", "follower")
		systest.MustContain(t, "remove", systest.OK(t, srv, "", "cluster", "remove", "n2"), "removed node n2")
		if out := systest.OK(t, srv, "", "cluster", "status"); strings.Contains(out, "\nn2 ") {
			t.Errorf("n2 still listed after cluster remove:\n%s", out)
		}
		systest.Fails(t, srv, 1, "node_not_found", "cluster", "remove", "n2")
	})

	t.Run("bench", func(t *testing.T) {
		out := systest.OK(t, srv, "", "bench", "--duration", "1s", "--publishers", "2", "--consumers", "2", "--size", "64", "--key")
		systest.MustContain(t, "bench", out, "published", "consumed", "p50", "p999", "end to end")
		var r struct{ Published, Consumed int64 }
		out = systest.OK(t, srv, "", "bench", "--duration", "1s", "--json")
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.Published == 0 || r.Consumed != r.Published {
			t.Errorf("bench --json: %q (%v), want every published message consumed", out, err)
		}
		systest.Fails(t, srv, 2, "--size", "bench", "--size", "4")
		// On a terminal (script(1) gives it one) a progress line is rewritten in place.
		if sh, err := exec.LookPath("script"); err == nil {
			cmd := exec.Command(sh, "-qec", tc.Binary(t)+" bench --duration 2500ms --server "+srv, "/dev/null")
			out, err := cmd.CombinedOutput()
			if err != nil || !regexp.MustCompile(`\r\x1b\[K +\d+s +published \d+ \(\d+/s\) +consumed`).Match(out) ||
				!strings.Contains(string(out), "p999") {
				t.Errorf("bench on a terminal: %v\n%q", err, out)
			}
		} else {
			t.Log("no script(1): the terminal progress line is not checked")
		}
		if strings.Contains(systest.OK(t, srv, "", "topic", "list"), "bench-") {
			t.Error("bench left its topic behind")
		}
	})

	t.Run("help-version-errors", func(t *testing.T) {
		help := systest.OK(t, "", "", "--help")
		systest.MustContain(t, "--help", help, "topic create", "pub TOPIC", "sub TOPIC", "dlq replay", "cluster status",
			"bench", "token new", "--server", "--data-dir", "--bootstrap-expect")
		systest.MustContain(t, "pub --help", systest.OK(t, "", "", "pub", "--help"), "--partition-key", "--attr", "--server", "--tls-ca")
		systest.MustContain(t, "topic", systest.RunCLI(t, "", "", "topic").Stderr, "topic create", "topic delete")
		systest.MustContain(t, "--version", systest.OK(t, "", "", "--version"), "mqd ", "commit ", "go1.")
		systest.Fails(t, "", 2, "unknown command", "frobnicate")
		systest.Fails(t, "", 2, "unknown command", "topic", "frobnicate")
		systest.Fails(t, srv, 2, "flag provided but not defined", "topic", "list", "--nope")
		systest.Fails(t, srv, 2, "tls-ca", "topic", "list", "--tls-ca", filepath.Join(t.TempDir(), "missing.pem"))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://" + ln.Addr().String()
		ln.Close()
		systest.Fails(t, dead, 1, "connection refused", "topic", "list")
		// A dead first server fails over to the next; flags beat MQD_SERVER.
		systest.MustContain(t, "failover", systest.OK(t, "http://127.0.0.1:1", "", "topic", "list", "--server", dead+","+srv), "orders")
		systest.MustContain(t, "flags first", systest.OK(t, dead, "", "--server", srv, "--json", "topic", "list"), `{"topics":[`)
	})
}

// The client flags against a node with TLS and tokens: --tls-ca makes the
// https server trusted, --token (or MQD_TOKEN) authenticates, and the
// server's 401/403 come back as a non-zero exit with its message.
func TestCLITLSAndToken(t *testing.T) {
	t.Parallel()
	ca := tc.NewCA(t, "cli-ca")
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*"}, "pub": {"publish:orders*"}})
	cl := tc.NewTLSClient(15*time.Second, 4, ca.Pool(), nil).WithToken(fx.Secrets["ops"])
	c := tc.Start(t, 1, tc.WithTLS(ca), tc.WithClient(cl), tc.WithFlags("--auth-file", fx.Path))
	srv := c.Node(0).URL()
	if !strings.HasPrefix(srv, "https://") {
		t.Fatalf("node URL %s, want https", srv)
	}
	run := func(token string, args ...string) systest.CliRun {
		return systest.RunCLIEnv(t, []string{"MQD_SERVER=" + srv, "MQD_TOKEN=" + token}, "", args...)
	}
	expect := func(r systest.CliRun, code int, want string) {
		t.Helper()
		if r.Code != code || !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("exit %d, stdout %q, stderr %q; want exit %d with %q", r.Code, r.Stdout, r.Stderr, code, want)
		}
	}
	expect(run("", "topic", "create", "orders", "--tls-ca", ca.CertPath(), "--token", fx.Secrets["ops"]), 0, "created topic orders")
	expect(run(fx.Secrets["ops"], "topic", "list"), 1, "certificate")                               // no --tls-ca: not trusted
	expect(run("", "topic", "list", "--tls-ca", ca.CertPath()), 1, "unauthenticated")               // no token
	expect(run("wrong", "topic", "list", "--tls-ca", ca.CertPath()), 1, "unauthenticated")          // unknown token
	expect(run(fx.Secrets["pub"], "pub", "orders", "hi", "--tls-ca", ca.CertPath()), 0, "offset 0") // MQD_TOKEN
	expect(run(fx.Secrets["pub"], "topic", "delete", "orders", "--tls-ca", ca.CertPath()), 1, "forbidden")
	expect(run(fx.Secrets["pub"], "sub", "orders", "--group", "g", "--tls-ca", ca.CertPath()), 1, "forbidden")
	expect(run(fx.Secrets["ops"], "topic", "info", "orders", "--tls-ca", ca.CertPath()), 0, "messages  1")
}

// A one-shot command gives up after trying each server twice (at least
// four tries), saying where nothing listens; sub keeps the client's ten
// tries, riding out a node's restart.
func TestCLIGivesUpOnDeadServers(t *testing.T) {
	t.Parallel()
	// A server that takes each connection and closes it at once: every
	// try is one accepted connection, and a GET may be tried again.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan struct{}, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- struct{}{} // counted before the client can see the close
			c.Close()
		}
	}()
	closing := "http://" + ln.Addr().String()
	tries := func(args ...string) int {
		t.Helper()
		r := systest.RunCLI(t, closing, "", args...)
		if r.Code != 1 {
			t.Errorf("mqd %s: exit %d, stderr %q; want 1", strings.Join(args, " "), r.Code, r.Stderr)
		}
		return countOut(conns)
	}
	if n := tries("topic", "list"); n != 4 {
		t.Errorf("topic list against one closing server: %d tries, want 4", n)
	}
	if n := tries("sub", "orders", "--group", "g", "--wait", "1s"); n != 10 {
		t.Errorf("sub against one closing server: %d tries, want the client's 10", n)
	}

	dl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + dl.Addr().String()
	dl.Close()
	systest.Fails(t, dead, 1, "no mqd listens at --server "+dead, "topic", "list")
	// Three servers: each is tried twice.
	if n := tries("topic", "list", "--server", strings.Join([]string{closing, dead, dead}, ",")); n != 2 {
		t.Errorf("topic list against three servers, one closing: %d tries of it, want 2", n)
	}
}

// countOut empties ch and returns how many it took out.
func countOut(ch chan struct{}) int {
	n := 0
	for {
		select {
		case <-ch:
			n++
		default:
			return n
		}
	}
}
