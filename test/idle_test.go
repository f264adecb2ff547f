package test

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var (
	idleTopics = flag.Int("idle.topics", 1000, "TestIdleLeaderCPU: topics to create")
	idleGroups = flag.Int("idle.groups", 4, "TestIdleLeaderCPU: groups per topic")
	idleWindow = flag.Duration("idle.window", 10*time.Second, "TestIdleLeaderCPU: how long to measure idle CPU")
)

// cpuTicks is the process's user+system CPU time in clock ticks (100 a
// second on Linux), from /proc/PID/stat.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) start after ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14: utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15: stime
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return ut + st, nil
}

// parallel runs fn(i) for i in [0, n) on w workers and returns the first error.
func parallel(n, w int, fn func(i int) error) error {
	var mu sync.Mutex
	var first error
	next := make(chan int)
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					first = cmp(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// An idle leader's CPU does not grow with the number of topics and groups:
// nothing it does while idle visits every topic or group (the replay pacer
// visits only groups with a replay queued). A page of GET /v1/topics reads
// only its page, and /metrics stays quick. Sizes by flag: the figures in
// docs/reliability.md are from -idle.topics 10000 -idle.groups 4.
func TestIdleLeaderCPU(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 10*time.Minute)
	start := time.Now()
	name := func(i int) string { return fmt.Sprintf("idle-%05d", i) }
	err := parallel(*idleTopics, 32, func(i int) error {
		if _, err := n.PutTopic(ctx, name(i), nil); err != nil {
			return err
		}
		for g := range *idleGroups {
			r, err := n.Do(ctx, http.MethodPut, fmt.Sprintf("/v1/topics/%s/groups/g%d", name(i), g), nil, nil)
			if err == nil {
				err = r.Expect(200, 201)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("create %d topics × %d groups: %v", *idleTopics, *idleGroups, err)
	}
	t.Logf("created %d topics and %d groups in %v", *idleTopics, *idleTopics**idleGroups, time.Since(start).Round(time.Second))
	time.Sleep(2 * time.Second) // let the creation's own work settle
	before, err := cpuTicks(n.PID())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(*idleWindow)
	after, err := cpuTicks(n.PID())
	if err != nil {
		t.Fatal(err)
	}
	pct := float64(after-before) / 100 / idleWindow.Seconds() * 100
	t.Logf("idle leader with %d topics, %d groups: %.1f %% of a core over %v (%d ticks)",
		*idleTopics, *idleTopics**idleGroups, pct, *idleWindow, after-before)
	if pct > 2 {
		t.Errorf("idle leader uses %.1f %% of a core with %d topics and %d groups, want ≤ 2 %%", pct, *idleTopics, *idleTopics**idleGroups)
	}

	// A page of topics, then the next one.
	for _, q := range []string{"?limit=100", "?limit=100&after=" + name(99)} {
		t0 := time.Now()
		r, err := n.Do(ctx, http.MethodGet, "/v1/topics"+q, nil, nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("GET /v1/topics%s: %v %v", q, r, err)
		}
		var page struct {
			Topics []struct{ Name string }
			Next   string
		}
		if err := r.JSON(&page); err != nil {
			t.Fatal(err)
		}
		t.Logf("GET /v1/topics%s: %d topics, next %q, %v", q, len(page.Topics), page.Next, time.Since(t0).Round(time.Millisecond))
		if len(page.Topics) != 100 || page.Next != page.Topics[99].Name {
			t.Errorf("GET /v1/topics%s: %d topics, next %q; want 100 and the last one's name", q, len(page.Topics), page.Next)
		}
		if q != "?limit=100" && page.Topics[0].Name != name(100) {
			t.Errorf("second page starts at %q, want %q", page.Topics[0].Name, name(100))
		}
	}
	// /metrics grows with topics × groups (one series per group and
	// family): measured (wall time and the node's CPU), not bounded here
	// (docs/performance.md).
	for i := range 2 {
		t0 := time.Now()
		c0, err := cpuTicks(n.PID())
		if err != nil {
			t.Fatal(err)
		}
		r, err := n.Do(ctx, http.MethodGet, "/metrics", nil, nil)
		c1, _ := cpuTicks(n.PID())
		if err != nil || r.Status != 200 {
			t.Logf("/metrics: no answer after %v: %v %v", time.Since(t0).Round(time.Millisecond), r, err)
			continue
		}
		t.Logf("/metrics scrape %d: %d bytes in %v, node CPU %.2f s", i+1, len(r.Body), time.Since(t0).Round(time.Millisecond), float64(c1-c0)/100)
	}
}
