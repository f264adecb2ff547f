package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestReadsWithoutQuorum kills two of three nodes and asks the survivor.
// Reads that need no commit fail within seconds with no_leader, saying
// so (not calling them writes), and with ?stale=ok answer from the node's
// applied state with Mq-Stale-Ms and Mq-Applied-Index; a write answers 503
// with Retry-After within its deadline; the CLI says it waits, gives up
// at --timeout and says that the write may still commit. On 1b577be the
// read waited its whole 10 s deadline and answered "no quorum: the write
// could not be committed in time", and ?stale=ok was a 400.
func TestReadsWithoutQuorum(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, "q", map[string]any{"partitions": 2})
	for i := range 5 {
		tc.MustPublish(t, l, "q", fmt.Sprintf("m%d", i), nil)
	}
	if _, _, err := l.Fetch(tc.CtxFor(t, 15*time.Second), "q", "g", tc.FetchRequest{Max: 1}); err != nil {
		t.Fatal(err)
	}
	tc.WaitApplied(t, c)
	s := fs[0]
	if systest.TopicGroup(t, l, "q") != "default" {
		// The survivor follows in the topic's data group too: a leader
		// that lost its quorum serves reads until its lease runs out, in
		// any group.
		if gl, _ := systest.PlacedRoles(t, c, "q"); gl == s {
			s = fs[1]
		}
	}
	for _, n := range c.Nodes() {
		if n != s {
			n.Kill()
		}
	}

	paths := []string{"/v1/topics", "/v1/topics/q", "/v1/topics/q/messages", "/v1/topics/q/groups/g/dlq"}
	var wg sync.WaitGroup
	for _, path := range paths {
		wg.Add(1)
		go func() { // each waits up to 3 s for a leader: at once
			defer wg.Done()
			checkNoLeaderRead(t, s, path)
		}()
	}
	wg.Wait()
	for _, path := range paths {
		start := time.Now()
		r, err := s.Do(tc.CtxFor(t, 30*time.Second), "GET", path+"?stale=ok", nil, nil)
		t.Logf("GET %s?stale=ok: %v in %v, Mq-Stale-Ms %s", path, r.Status, time.Since(start).Round(time.Microsecond), r.Header.Get("Mq-Stale-Ms"))
		if err != nil {
			t.Fatal(err)
		}
		stale, serr := strconv.ParseInt(r.Header.Get("Mq-Stale-Ms"), 10, 64)
		applied, aerr := strconv.ParseUint(r.Header.Get("Mq-Applied-Index"), 10, 64)
		if r.Status != 200 || serr != nil || aerr != nil || stale <= 0 || applied == 0 {
			t.Errorf("GET %s?stale=ok: %d, Mq-Stale-Ms %q, Mq-Applied-Index %q: %s", path, r.Status,
				r.Header.Get("Mq-Stale-Ms"), r.Header.Get("Mq-Applied-Index"), r.Body)
		}
	}
	var pg systest.BrowsePage
	if r, err := s.Do(tc.CtxFor(t, 15*time.Second), "GET", "/v1/topics/q/messages?stale=ok", nil, nil); err != nil || r.JSON(&pg) != nil || len(pg.Messages) != 5 {
		t.Errorf("stale browse: %v, %d messages", err, len(pg.Messages))
	}
	if r, err := s.Do(tc.CtxFor(t, 15*time.Second), "GET", "/v1/cluster", nil, nil); err != nil || r.Status != 200 {
		t.Errorf("GET /v1/cluster without a quorum: %v %v", r, err)
	}

	// A write keeps its promise: 503 with Retry-After within its deadline.
	start := time.Now()
	r, err := s.Do(tc.CtxFor(t, 30*time.Second), "POST", "/v1/topics/q/messages", "w", map[string]string{"Mq-Timeout-Ms": "2000"})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); r.Status != 503 || r.Header.Get("Retry-After") == "" || took > 6*time.Second {
		t.Errorf("publish without a quorum: %d in %v: %s", r.Status, took, r.Body)
	}

	// The CLI: a line while it waits, --timeout, and the write's fate.
	start = time.Now()
	res := systest.RunCLI(t, s.URL(), "", "pub", "q", "late", "--key", "late-1", "--timeout", "3s")
	took := time.Since(start)
	t.Logf("mqd pub --timeout 3s without a quorum: exit %d in %v; stderr:\n%s", res.Code, took.Round(time.Millisecond), res.Stderr)
	if res.Code == 0 || took > 10*time.Second || !strings.Contains(res.Stderr, "waiting for the write") ||
		!strings.Contains(res.Stderr, "may still commit") || strings.Contains(res.Stdout, "waiting") {
		t.Errorf("mqd pub --timeout 3s without a quorum: exit %d in %v\nstdout: %s\nstderr: %s", res.Code, took, res.Stdout, res.Stderr)
	}
	res = systest.RunCLI(t, s.URL(), "", "peek", "q", "--stale")
	if res.Code != 0 || !strings.Contains(res.Stderr, "own state") ||
		len(strings.Split(strings.TrimSpace(res.Stdout), "\n")) != 6 {
		t.Errorf("mqd peek --stale without a quorum: exit %d\nstdout: %s\nstderr: %s", res.Code, res.Stdout, res.Stderr)
	}
	res = systest.RunCLI(t, s.URL(), "", "topic", "list", "--timeout", "20s")
	if res.Code == 0 || strings.Contains(res.Stderr, "write") || !strings.Contains(res.Stderr, "no leader") {
		t.Errorf("mqd topic list without a quorum: exit %d\nstderr: %s", res.Code, res.Stderr)
	}
}

// checkNoLeaderRead: a read without ?stale=ok fails within seconds with
// no_leader, and its message does not call it a write.
func checkNoLeaderRead(t *testing.T, s *tc.Node, path string) {
	start := time.Now()
	r, err := s.Do(tc.CtxFor(t, 30*time.Second), "GET", path, nil, nil)
	if err != nil {
		t.Error(err)
		return
	}
	took := time.Since(start)
	code, _ := r.CheckError()
	msg := string(r.Body)
	t.Logf("GET %s without a quorum: %d %s in %v", path, r.Status, code, took.Round(time.Millisecond))
	if r.Status != 503 || code != "no_leader" || r.Header.Get("Retry-After") == "" || took > 8*time.Second ||
		strings.Contains(msg, "write") || !strings.Contains(msg, "stale=ok") {
		t.Errorf("GET %s without a quorum: %d %s in %v (Retry-After %q): %s", path, r.Status, code, took.Round(time.Millisecond),
			r.Header.Get("Retry-After"), msg)
	}
}

// TestLeaderKilledUnderLoad: many concurrent requests through the
// followers while the leader is SIGKILLed: every answer is a success or
// one of mqd's JSON errors, never an HTTP library's text. On 1b577be
// followers answered 503 "unavailable: forward to leader ...: the server
// closed connection before returning the first response byte. ..."
func TestLeaderKilledUnderLoad(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, "load", map[string]any{"partitions": 4})
	ctx, cancel := context.WithCancel(tc.CtxFor(t, 90*time.Second))
	defer cancel()
	cl := tc.NewClient(30*time.Second, 64)
	var (
		mu     sync.Mutex
		bad    []string
		counts = map[string]int{}
		n      atomic.Int64
	)
	record := func(r *tc.Response) {
		mu.Lock()
		defer mu.Unlock()
		key := strconv.Itoa(r.Status)
		if r.Status >= 300 {
			code, err := r.CheckError()
			body := strings.ToLower(string(r.Body))
			if err != nil || strings.Contains(body, "fasthttp") || strings.Contains(body, "first response byte") ||
				strings.Contains(body, "dial tcp") || strings.Contains(body, "connection reset") || strings.Contains(body, "eof") {
				bad = append(bad, fmt.Sprintf("%s %s: %d %s", r.Method, r.URL, r.Status, r.Body))
			}
			key += " " + code
		}
		counts[key]++
	}
	var wg sync.WaitGroup
	for w := range 24 {
		f := fs[w%len(fs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				var r *tc.Response
				var err error
				switch (w + i) % 4 {
				case 0, 1:
					r, err = cl.Do(ctx, "POST", f.URL()+"/v1/topics/load/messages", fmt.Sprintf("w%d-%d", w, i),
						map[string]string{"Idempotency-Key": fmt.Sprintf("k%d-%d", w, i)})
				case 2:
					r, err = cl.Do(ctx, "GET", f.URL()+"/v1/topics/load", nil, nil)
				default:
					r, err = cl.Do(ctx, "GET", f.URL()+"/v1/topics/load/messages?limit=5", nil, nil)
				}
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("no answer from follower %s: %v", f, err))
						mu.Unlock()
					}
					return
				}
				n.Add(1)
				record(r)
			}
		}()
	}
	waitCount(t, &n, 300)
	l.Kill()
	after := n.Load()
	// Until a new leader serves and a few hundred more answers came.
	if _, err := c.Leader(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, &n, after+300)
	cancel()
	wg.Wait()
	t.Logf("answers: %v", counts)
	for i, b := range bad {
		if i == 10 {
			t.Errorf("... and %d more", len(bad)-10)
			break
		}
		t.Error(b)
	}
}

// waitCount waits (bounded) until n reaches want.
func waitCount(t *testing.T, n *atomic.Int64, want int64) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for n.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("only %d answers, want %d", n.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
