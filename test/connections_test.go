package test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// dialFrom opens a TCP connection to n from the loopback address src
// (127.0.0.0/8 is all loopback on Linux), so that one test can act as many
// client addresses.
func dialFrom(src string, n *tc.Node) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", n.HTTPAddr())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// waitSeries polls series on n until ok accepts its value or ctx ends.
func waitSeries(ctx context.Context, n *tc.Node, series string, ok func(float64) bool) (float64, error) {
	for {
		v, err := systest.MetricSample(ctx, n, series)
		if err == nil && ok(v) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("%s = %v (last error %v): %w", series, v, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// firstAnswer reads what the server sent on c within d: its status line,
// or "" with closed set when the server closed without answering.
func firstAnswer(c net.Conn, d time.Duration) (status string, closed bool) {
	c.SetReadDeadline(time.Now().Add(d))
	line, err := bufio.NewReader(c).ReadString('\n')
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "", false
	}
	return strings.TrimSpace(line), err != nil
}

// timedPublish publishes one message through n and fails the test if it
// does not succeed within bound.
func timedPublish(t *testing.T, n *tc.Node, topic, payload string, bound time.Duration) {
	t.Helper()
	start := time.Now()
	if _, _, err := n.Publish(tc.CtxFor(t, bound), topic, []byte(payload), nil); err != nil {
		t.Errorf("publish %q via %s: %v", payload, n, err)
	} else if d := time.Since(start); d > bound {
		t.Errorf("publish %q via %s took %v (bound %v)", payload, n, d, bound)
	}
}

// Idle connections beyond the per-address limit are refused at once with a
// JSON 429, so one flooding client does not stop others; past the total
// limit new connections get a JSON 503 until the read timeout has cut the
// idle ones; slowloris clients (a head or a body one byte a second) are cut
// off; the node serves normal clients throughout and counts it all in
// /metrics.
func TestConnectionLimits(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, tc.WithFlags("--max-connections", "300", "--max-connections-per-ip", "100",
		"--http-read-timeout", "2s", "--http-idle-timeout", "2s"))
	n := c.Node(0)
	tc.MustTopic(t, n, "conns", nil)
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	open := func(src string, count int) []*net.TCPConn {
		var out []*net.TCPConn
		for range count {
			c, err := dialFrom(src, n)
			if err != nil {
				t.Fatalf("dial from %s: %v", src, err)
			}
			out = append(out, c)
		}
		conns = append(conns, out...)
		return out
	}

	// One address opens 150 idle connections: 100 are kept, 50 refused.
	flood := open("127.0.0.2", 150)
	timedPublish(t, n, "conns", "during a per-address flood", time.Second)
	refused := 0
	for _, c := range flood[100:] {
		if st, _ := firstAnswer(c, 2*time.Second); strings.HasPrefix(st, "HTTP/1.1 429") {
			refused++
		}
	}
	if refused != 50 {
		t.Errorf("connections 101..150 from one address: %d answered 429, want 50", refused)
	}
	ctx := tc.CtxFor(t, 30*time.Second)
	if v, err := systest.MetricSample(ctx, n, `mqd_http_connections_rejected_total{reason="per_ip"}`); err != nil || v != 50 {
		t.Errorf("mqd_http_connections_rejected_total{per_ip} = %v, %v; want 50", v, err)
	}

	// Five more addresses, 100 each: the total of 300 is reached.
	var more []*net.TCPConn
	for i := 3; i <= 7; i++ {
		more = append(more, open(fmt.Sprintf("127.0.0.%d", i), 100)...)
	}
	// (A scrape may itself be refused while the node is full: WaitMetric retries.)
	if _, err := waitSeries(tc.CtxFor(t, 5*time.Second), n, `mqd_http_connections_rejected_total{reason="total"}`,
		func(v float64) bool { return v >= 250 }); err != nil {
		t.Errorf("connections refused over the total of 300 (650 opened): %v; want ≥ 250", err)
	}
	// The idle connections are cut after the 2 s read timeout; then a
	// normal client is served again.
	start := time.Now()
	for _, c := range append(flood[:100], more[:20]...) {
		if st, closed := firstAnswer(c, 6*time.Second-time.Since(start)); !closed {
			t.Errorf("an idle connection is still open %v after the flood (read timeout 2 s): %q", time.Since(start), st)
			break
		}
	}
	t.Logf("idle connections cut %v after the flood", time.Since(start))
	if _, err := waitSeries(ctx, n, "mqd_http_connections_open", func(v float64) bool { return v <= 5 }); err != nil {
		t.Errorf("open connections after the idle ones were cut: %v", err)
	}
	timedPublish(t, n, "conns", "after the flood", time.Second)

	for _, c := range conns {
		c.Close()
	}
	// Slowloris: a head, and a body, one byte a second. Each is cut off
	// within its bound while a normal client is served.
	head := "POST /v1/topics/conns/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
	slow := func(name string, prefix, drip string, bound time.Duration) <-chan string {
		out := make(chan string, 1)
		go func() {
			c, err := dialFrom("127.0.0.8", n)
			if err != nil {
				out <- err.Error()
				return
			}
			defer c.Close()
			start := time.Now()
			c.Write([]byte(prefix))
			for i := 0; time.Since(start) < bound+5*time.Second; i++ {
				if _, err := c.Write([]byte{drip[i%len(drip)]}); err != nil {
					out <- fmt.Sprintf("%s: cut off after %v", name, time.Since(start).Round(100*time.Millisecond))
					if d := time.Since(start); d > bound {
						out <- fmt.Sprintf("%s: cut off only after %v, bound %v", name, d, bound)
					}
					return
				}
				time.Sleep(time.Second)
			}
			out <- fmt.Sprintf("%s: still open after %v, bound %v", name, time.Since(start), bound)
		}()
		return out
	}
	// The head: 2 s to the first byte's arrival, 2 s more to its end; the
	// body: 2 s plus 100 bytes at 1 MiB/s. Detecting the cut takes a write
	// or two more.
	sh := slow("slow head", "", head, 7*time.Second)
	sb := slow("slow body", head, strings.Repeat("x", 100), 6*time.Second)
	for range 5 {
		timedPublish(t, n, "conns", "during slowloris", time.Second)
		time.Sleep(500 * time.Millisecond)
	}
	for _, ch := range []<-chan string{sh, sb} {
		msg := <-ch
		if !strings.Contains(msg, "cut off after") {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
		select {
		case late := <-ch:
			t.Error(late)
		default:
		}
	}
	if r, err := n.Do(ctx, http.MethodGet, "/healthz", nil, nil); err != nil || r.Status != http.StatusOK {
		t.Errorf("/healthz after the floods: %v %v", r, err)
	}
}

// A node whose process runs out of file descriptors (EMFILE on accept)
// keeps running and accepting: it backs off, counts the errors, and serves
// again once descriptors are free. (Before, fasthttp's Serve returned the
// accept error and mqd exited.)
func TestAcceptSurvivesEMFILE(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	c := tc.Start(t, 1, tc.WithFlags("--http-read-timeout", "2s"))
	n := c.Node(0)
	tc.MustTopic(t, n, "emfile", nil)
	// Leave the node ~100 descriptors above what it uses now.
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.PID()))
	if err != nil {
		t.Fatal(err)
	}
	lim := len(fds) + 100
	if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(n.PID()), fmt.Sprintf("--nofile=%d:%d", lim, lim)).CombinedOutput(); err != nil {
		t.Fatalf("prlimit: %v: %s", err, out)
	}
	var conns []*net.TCPConn
	for i := range 400 {
		c, err := dialFrom(fmt.Sprintf("127.0.0.%d", 2+i/100), n)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	ctx := tc.CtxFor(t, 30*time.Second)
	if v, err := waitSeries(ctx, n, "mqd_http_accept_errors_total", func(v float64) bool { return v > 0 }); err != nil {
		// The scrape itself needs a descriptor: it may only get one once
		// the idle connections are cut (2 s).
		t.Errorf("accept errors counted: %v, %v; want > 0 (the flood should exhaust %d descriptors)", v, err, lim)
	}
	for _, c := range conns {
		c.Close()
	}
	if !n.Running() {
		t.Fatalf("the node exited under the connection flood")
	}
	timedPublish(t, n, "emfile", "after EMFILE", 5*time.Second)
	if b, err := os.ReadFile(n.LogPath()); err == nil && bytes.Contains(b, []byte("mqd stopped")) {
		t.Errorf("the node logged that it stopped")
	}
}

// pollConn is a raw long-polling fetch, so that the test can hold and drop
// thousands of them cheaply.
type pollConn struct {
	c      *net.TCPConn
	answer chan string // the body of the answer, or "" when none came
}

func startPoll(n *tc.Node, src, path string, waitMs int) (*pollConn, error) {
	c, err := dialFrom(src, n)
	if err != nil {
		return nil, err
	}
	body := fmt.Sprintf(`{"max":1,"wait_ms":%d}`, waitMs)
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	if _, err := c.Write([]byte(req)); err != nil {
		c.Close()
		return nil, err
	}
	p := &pollConn{c: c, answer: make(chan string, 1)}
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			p.answer <- ""
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p.answer <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	return p, nil
}

func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// 2,000 long-polls through a follower with a forwarding pool of 16 park on
// the follower, not on the leader: writes through that follower keep
// succeeding, a publish wakes exactly as many polls as it has messages,
// and polls whose clients disconnect are released within a second or so.
func TestLongPollsThroughFollower(t *testing.T) {
	t.Parallel()
	const polls = 2000
	c := tc.Start(t, 3, tc.WithFlags("--forward-connections", "16", "--max-connections-per-ip", "5000"))
	leader, fs := tc.MustRoles(t, c)
	f := fs[0]
	tc.MustTopic(t, leader, "lp", nil)
	tc.MustTopic(t, leader, "other", nil)
	// The group exists first, so that the polls have nothing to create.
	if r, err := leader.Do(tc.CtxFor(t, 10*time.Second), "PUT", "/v1/topics/lp/groups/g", nil, nil); err != nil || r.Status/100 != 2 {
		t.Fatalf("create group: %v %v", r, err)
	}
	rssBefore, _ := vmRSS(f.PID())
	var ps []*pollConn
	defer func() {
		for _, p := range ps {
			p.c.Close()
		}
	}()
	for i := range polls {
		p, err := startPoll(f, fmt.Sprintf("127.0.0.%d", 2+i/500), "/v1/topics/lp/groups/g/fetch", 60000)
		if err != nil {
			t.Fatalf("poll %d: %v", i, err)
		}
		ps = append(ps, p)
	}
	ctx := tc.CtxFor(t, 60*time.Second)
	if _, err := waitSeries(tc.CtxFor(t, 20*time.Second), f, "mqd_fetch_waiting", func(v float64) bool { return v >= polls }); err != nil {
		t.Errorf("polls parked on the follower: %v", err)
	}
	rss, _ := vmRSS(f.PID())
	t.Logf("follower RSS %d MiB before, %d MiB with %d parked polls (%.1f KiB each)",
		rssBefore>>20, rss>>20, polls, float64(rss-rssBefore)/polls/1024)
	if v, _ := systest.MetricSample(ctx, leader, "mqd_fetch_waiting"); v != 0 {
		t.Errorf("%v polls parked on the leader, want 0 (the follower waits locally)", v)
	}

	// Writes through the follower: none fails.
	for i := range 20 {
		timedPublish(t, f, "other", fmt.Sprintf("w%d", i), 2*time.Second)
	}
	// Five messages to the polled topic wake five polls with a message each.
	for i := range 5 {
		tc.MustPublish(t, leader, "lp", fmt.Sprintf("m%d", i), nil)
	}
	got, answered, deadline := 0, make([]bool, len(ps)), time.After(10*time.Second)
	var bad []string
wait:
	for got < 5 {
		for i, p := range ps {
			if answered[i] {
				continue
			}
			select {
			case a := <-p.answer:
				answered[i] = true
				if strings.HasPrefix(a, "200 ") && strings.Contains(a, `"receipt"`) {
					got++
				} else {
					bad = append(bad, systest.Shorten(a))
				}
			default:
			}
		}
		select {
		case <-deadline:
			break wait
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got != 5 || len(bad) > 0 {
		t.Errorf("after 5 messages: %d polls answered with a message, want 5; other answers: %v", got, bad)
	}

	// Polls on the leader itself park there.
	for i := range 100 {
		p, err := startPoll(leader, "127.0.0.9", "/v1/topics/lp/groups/g/fetch", 60000)
		if err != nil {
			t.Fatalf("poll %d on the leader: %v", i, err)
		}
		ps = append(ps, p)
	}
	if _, err := waitSeries(tc.CtxFor(t, 10*time.Second), leader, "mqd_fetch_waiting", func(v float64) bool { return v == 100 }); err != nil {
		t.Errorf("polls parked on the leader: %v", err)
	}

	// The clients go away: every parked poll is released, on both nodes.
	for _, p := range ps {
		p.c.Close()
	}
	if _, err := waitSeries(tc.CtxFor(t, 5*time.Second), leader, "mqd_fetch_waiting", func(v float64) bool { return v == 0 }); err != nil {
		t.Errorf("polls still parked on the leader after their clients disconnected: %v", err)
	}
	start := time.Now()
	if _, err := waitSeries(tc.CtxFor(t, 5*time.Second), f, "mqd_fetch_waiting", func(v float64) bool { return v == 0 }); err != nil {
		t.Errorf("polls still parked after their clients disconnected: %v", err)
	}
	t.Logf("%d abandoned polls released in %v", polls-5, time.Since(start))
	timedPublish(t, f, "other", "after the polls", 2*time.Second)
}
