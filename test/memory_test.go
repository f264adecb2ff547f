package test

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// rssBound is the most anonymous resident memory a node may reach under
// the large bodies of TestLargeBodiesBoundedMemory (docs/reliability.md).
const rssBound = 1280 << 20

// peakSampler samples a process's anonymous resident memory (RssAnon: the
// heap and stacks, not the data files bbolt and the raft log map, which
// the kernel can drop) every 20 ms until stopped, and keeps the highest.
func peakSampler(pid int) (stop func() int64) {
	done := make(chan struct{})
	res := make(chan int64, 1)
	go func() {
		var peak int64
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := systest.StatusKB(pid, "RssAnon"); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-done:
				res <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 { close(done); return <-res }
}

// 30 clients publish a 16 MiB message each, at once, to one node: the
// node admits bodies against its in-flight budget (128 MiB by default) and
// answers the rest 503 with Retry-After before reading them (status 0 in
// the log: the client saw its connection reset while still sending), so
// its peak RSS stays under rssBound; it survives, and each client that
// retries gets its message stored once.
func TestLargeBodiesBoundedMemory(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	tc.MustTopic(t, n, "big", map[string]any{"max_message_bytes": 16 << 20})
	const clients, size = 30, 16 << 20
	base, _ := systest.StatusKB(n.PID(), "RssAnon")
	stop := peakSampler(n.PID())
	ctx := tc.CtxFor(t, 3*time.Minute)
	var mu sync.Mutex
	statuses := map[int]int{}
	var bad []string
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := bytes.Repeat([]byte{byte('a' + i%26)}, size)
			// Each client retries 503s (as the Retry-After says), with
			// its idempotency key, until stored.
			for attempt := 0; ctx.Err() == nil; attempt++ {
				r, err := n.Do(ctx, http.MethodPost, "/v1/topics/big/messages", body,
					map[string]string{"Idempotency-Key": fmt.Sprintf("big-%d", i), "Mq-Timeout-Ms": "60000"})
				mu.Lock()
				if err != nil {
					// Refused before its body was read, the request's
					// connection is closed while the client may still be
					// sending: it sees a reset instead of the 503 (unless
					// it sent Expect: 100-continue). Retried like a 503.
					statuses[0]++
					mu.Unlock()
					time.Sleep(time.Duration(100+50*attempt%500) * time.Millisecond)
					continue
				}
				statuses[r.Status]++
				mu.Unlock()
				switch {
				case r.Status == http.StatusCreated || r.Status == http.StatusOK:
					return
				case r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "":
					time.Sleep(time.Duration(100+50*attempt%500) * time.Millisecond)
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("client %d: %d %s", i, r.Status, systest.Shorten(string(r.Body))))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	peak := stop()
	hwm, err := systest.StatusKB(n.PID(), "VmHWM")
	if err != nil {
		t.Fatalf("node gone? %v", err)
	}
	t.Logf("30 x 16 MiB publishes: answers %v; peak anonymous RSS %d MiB (%d MiB before); VmHWM (with mapped data files) %d MiB",
		statuses, peak>>20, base>>20, hwm>>20)
	if len(bad) > 0 {
		t.Errorf("answers other than 201/200 or 503 with Retry-After: %v", bad)
	}
	if peak > rssBound {
		t.Errorf("peak anonymous RSS %d MiB, over the documented bound of %d MiB", peak>>20, rssBound>>20)
	}
	if s, err := n.Stats(tc.CtxFor(t, 15*time.Second), "big"); err != nil || s.Messages != clients {
		t.Errorf("stored %d messages (%v), want %d", s.Messages, err, clients)
	}
	tc.MustPublish(t, n, "big", "small after the flood", nil)
}

// A fetch's answer is bounded in bytes: with messages of 5 MiB, a fetch of
// up to 10 gets two (the lease stops once it holds 8 MiB), the next the
// last one; before the bound one answer held all of them (up to 1000
// messages of up to 16 MiB: gigabytes for the leader to copy and encode).
func TestFetchAnswerBoundedInBytes(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 60*time.Second)
	if _, err := tc.WaitView(ctx, n, "state format 2 or later", func(ci tc.ClusterInfo) bool { return ci.StateFormat >= 2 }); err != nil {
		t.Fatal(err)
	}
	tc.MustTopic(t, n, "big", map[string]any{"max_message_bytes": 16 << 20})
	big := strings.Repeat("m", 5<<20)
	for range 3 {
		tc.MustPublish(t, n, "big", big, nil)
	}
	var counts []int
	for range 2 {
		msgs, _, err := n.Fetch(ctx, "big", "g", tc.FetchRequest{Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, len(msgs))
	}
	if !slices.Equal(counts, []int{2, 1}) {
		t.Fatalf("two fetches of up to 10 messages of 5 MiB took %v, want [2 1]", counts)
	}
}
