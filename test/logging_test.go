package test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// logLine is one line of a node's --log-format json log.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// readJSONLog reads a node's log from byte offset from, failing on any line
// that is not a JSON object (the harness's own "=== testcluster" lines
// aside): raft's lines too must come through slog in the one format.
func readJSONLog(t *testing.T, n *tc.Node, from int) ([]logLine, int) {
	t.Helper()
	b, err := os.ReadFile(n.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	var out []logLine
	for _, s := range strings.Split(string(b[from:]), "\n") {
		if s == "" || strings.HasPrefix(s, "=== testcluster") {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("%s: a log line is not JSON (--log-format json): %q", n.ID(), s)
		}
		out = append(out, l)
	}
	return out, len(b)
}

func loud(lines []logLine) []string {
	var out []string
	for _, l := range lines {
		if lv := l.str("level"); lv == "WARN" || lv == "ERROR" {
			b, _ := json.Marshal(l)
			out = append(out, string(b))
		}
	}
	return out
}

// A normal start logs no warning or error; a dead follower is reported by
// the leader once ("raft peer unreachable"), not once per raft retry, and
// once more when it is back. All lines, raft's included, are JSON with
// --log-format json. pprof is off without --pprof.
func TestQuietLogs(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithFlags("--log-format", "json"))
	ctx := tc.CtxFor(t, 90*time.Second)
	leader, followers := tc.MustRoles(t, c)
	offsets := map[*tc.Node]int{}
	for _, n := range c.Nodes() {
		lines, end := readJSONLog(t, n, 0)
		if l := loud(lines); len(l) > 0 {
			t.Errorf("%s: a normal start logged %d warnings/errors:\n%s", n.ID(), len(l), strings.Join(l, "\n"))
		}
		offsets[n] = end
	}
	if r, err := leader.Do(ctx, "GET", "/debug/pprof/", nil, nil); err != nil || r.Status != 404 {
		t.Errorf("GET /debug/pprof/ without --pprof: %v %+v, want 404", err, r)
	}

	dead := followers[0]
	dead.Kill()
	// Keep the leader replicating while the peer is down; raft retries the
	// peer (heartbeats, appends) many times a second meanwhile.
	tc.MustTopic(t, leader, "quiet", nil)
	down := time.Now()
	for i := 0; time.Since(down) < 6*time.Second; i++ {
		tc.MustPublish(t, leader, "quiet", fmt.Sprintf("m%d", i), nil)
		if err := systest.Pause(ctx, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	lines, end := readJSONLog(t, leader, offsets[leader])
	offsets[leader] = end
	var unreachable int
	for _, l := range lines {
		if l.str("msg") == "raft peer unreachable" && l.str("peer") == dead.ID() {
			unreachable++
		}
	}
	t.Logf("leader: %d log lines, %d warnings/errors in %v with %s dead", len(lines), len(loud(lines)), time.Since(down).Round(time.Millisecond), dead.ID())
	if unreachable != 1 {
		t.Errorf("leader said %d times that %s is unreachable, want once", unreachable, dead.ID())
	}
	if l := loud(lines); len(l) > 2 || len(lines) > 10 {
		t.Errorf("leader logged %d lines (%d warnings/errors) in 6 s with a dead peer, want at most 10 (2):\n%s",
			len(lines), len(l), strings.Join(l, "\n"))
	}

	dead.Restart()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines, _ := readJSONLog(t, leader, offsets[leader])
		back := false
		for _, l := range lines {
			back = back || (l.str("msg") == "raft peer reachable again" && l.str("peer") == dead.ID())
		}
		if back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leader never said that %s is reachable again", dead.ID())
		}
		if err := systest.Pause(ctx, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

// Every answer carries Mq-Request-Id (the client's, or a new one); a
// request forwarded by a follower is logged on both nodes with the same
// request_id, and with its topic and idempotency key. --pprof serves
// profiles. With data groups, the follower and leader of the topic's group.
func TestRequestIDInLogs(t *testing.T) {
	t.Parallel()
	systest.GroupVariants(t, requestIDInLogs)
}

func requestIDInLogs(t *testing.T, opts ...tc.Option) {
	c := tc.Start(t, 2, append(opts, tc.WithFlags("--log-format", "json", "--log-level", "debug", "--pprof"))...)
	ctx := tc.CtxFor(t, 60*time.Second)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "rid", nil)
	if systest.TopicGroup(t, leader, "rid") != "default" {
		leader, followers = systest.PlacedRoles(t, c, "rid")
	}
	r, err := followers[0].Do(ctx, "POST", "/v1/topics/rid/messages", "x",
		map[string]string{"Mq-Request-Id": "req-42.a", "Idempotency-Key": "order-7"})
	if err == nil {
		err = r.Expect(201)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Header.Get("Mq-Request-Id"); got != "req-42.a" {
		t.Errorf("answer's Mq-Request-Id = %q, want the client's req-42.a", got)
	}
	r, err = leader.Do(ctx, "GET", "/v1/topics/rid", nil, map[string]string{"Mq-Request-Id": "bad id with spaces"})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Header.Get("Mq-Request-Id"); got == "" || strings.Contains(got, " ") {
		t.Errorf("answer to an invalid request id carries Mq-Request-Id %q, want a fresh valid one", got)
	}
	if r, err := leader.Do(ctx, "GET", "/debug/pprof/cmdline", nil, nil); err != nil || r.Status != 200 {
		t.Errorf("GET /debug/pprof/cmdline with --pprof: %v %+v, want 200", err, r)
	}
	for _, n := range []*tc.Node{followers[0], leader} {
		lines, _ := readJSONLog(t, n, 0)
		found := false
		for _, l := range lines {
			if l.str("request_id") == "req-42.a" {
				found = true
				if l.str("topic") != "rid" || l.str("idempotency_key") != "order-7" || l.str("route") != "/v1/topics/{topic}/messages" {
					t.Errorf("%s: request line lacks topic, key or route: %v", n.ID(), l)
				}
			}
		}
		if !found {
			t.Errorf("%s: no log line with request_id req-42.a", n.ID())
		}
	}
}
