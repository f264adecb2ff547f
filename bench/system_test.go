// Package bench holds mqd's benchmarks: whole-system ones that drive a
// cluster of real mqd processes over HTTP (internal/testcluster), and
// component ones that drive the log, dedup, delay and raftfsm packages in
// process, without raft. README.md lists them and what each reports.
//
//	go test -run '^$' -bench . ./bench/                        # everything, default sizes
//	go test -run '^$' -bench . -benchtime 5000x ./bench/       # b.N-driven ones at 5000 messages
//	go test -run '^$' -bench Publish -benchtime 5000x -count 5 ./bench/ | tee new.txt   # benchstat old.txt new.txt
//	go test -run '^$' -bench DedupIndex10M ./bench/            # the 10 M-key index (selected by name: full size)
//
// `go test ./bench/` without -bench runs nothing here: there are no tests,
// and no cluster starts until a benchmark does.
//
// This file has the shared harness: flags, the cluster and its HTTP driver,
// latency percentiles, and fixed-workload benchmarks.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/valyala/fasthttp"
)

// Flags of the package's benchmarks. On the go test command line they go
// after the package path (go test ./bench/ -bench.big): before it, go test
// takes the first unknown flag as the end of its own and the package path as
// an argument of the test binary.
var (
	flagBig = flag.Bool("bench.big", false,
		"run the big benchmarks at full size even when -bench does not name them (DedupIndex10M: 10 M keys)")
	flagRounds = flag.Int("bench.rounds", 4, "PublishKeyVsNoKey: rounds, each one window without keys and one with")
	flagRound  = flag.Duration("bench.round", 2*time.Second, "PublishKeyVsNoKey: length of each window")
	flagRate   = flag.Int("e2e.rate", 1000, "EndToEnd: messages per second published")
	flagE2EDur = flag.Duration("e2e.duration", 10*time.Second, "EndToEnd: how long to publish")
	flagDelMsg = flag.Int("delayed.msgs", 20000, "DelayedLateness: messages published")
	flagDelSpr = flag.Duration("delayed.spread", 3*time.Second, "DelayedLateness: delays are uniform over [200ms, 200ms+spread]")
	flagDedupN = flag.Int("dedup.keys", 0,
		"DedupIndex10M: keys in the index; 0 = 10 M when -bench names DedupIndex or -bench.big is set, else 1 M")
	flagHeapN = flag.Int("heap.msgs", 1_000_000, "PendingDelayedHeap: pending delayed messages (wheel entries)")
)

func TestMain(m *testing.M) { tc.Main(m) }

// payloadSize is the size of every whole-system message unless a benchmark says otherwise.
const payloadSize = 1024

// payload returns n bytes of lower-case letters.
func payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// system is a cluster of real mqd processes, driven through its leader.
type system struct {
	c      *tc.Cluster
	leader *tc.Node
	client *tc.Client
	// fast sends the publishes: the benchmark shares the machine's two
	// cores with the cluster, and fasthttp's client used about 14 µs of
	// CPU per request here against net/http's 40 µs.
	fast *fasthttp.Client
}

var topicSeq atomic.Int64

// startSystem starts an n-node cluster; it is killed in b's cleanup. The
// client keeps alive up to 256 idle connections per node, more than the
// benchmarks' concurrency, so that no request pays a TCP handshake.
func startSystem(b *testing.B, n int, flags ...string) *system {
	b.Helper()
	return startSystemWith(b, n, nil, flags...)
}

// startSystemWith is startSystem with options for the cluster.
func startSystemWith(b *testing.B, n int, opts []tc.Option, flags ...string) *system {
	b.Helper()
	client := tc.NewClient(60*time.Second, 256)
	// nodeHeap and profiling use /debug/pprof/.
	opts = append([]tc.Option{tc.WithClient(client), tc.WithFlags(append([]string{"--pprof"}, flags...)...)}, opts...)
	c := tc.Start(b, n, opts...)
	leader, err := c.Leader(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d-node cluster, driving leader %s", n, leader)
	fast := &fasthttp.Client{MaxConnsPerHost: 1024, NoDefaultUserAgentHeader: true,
		ReadTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second}
	return &system{c: c, leader: leader, client: client, fast: fast}
}

// topic creates a topic with a fresh name and cfg (nil: defaults).
func (s *system) topic(b *testing.B, prefix string, cfg map[string]any) string {
	b.Helper()
	name := fmt.Sprintf("%s-%d", prefix, topicSeq.Add(1))
	// A creation may meet a data group's leadership hand-off (503, to be
	// retried, as any client does); other answers end the bench.
	for deadline := time.Now().Add(15 * time.Second); ; {
		_, err := s.leader.PutTopic(context.Background(), name, cfg)
		if err == nil {
			return name
		}
		var se *tc.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			b.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// putGroup creates a consumer group ahead of its first fetch.
func (s *system) putGroup(b *testing.B, topic, group string) {
	b.Helper()
	r, err := s.leader.Do(context.Background(), http.MethodPut, "/v1/topics/"+topic+"/groups/"+group, nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK, http.StatusCreated)
	}
	if err != nil {
		b.Fatal(err)
	}
}

func (s *system) url(topic, suffix string) string {
	return s.leader.URL() + "/v1/topics/" + topic + suffix
}

// post sends body ([]byte, sent as is) to url and expects status want.
func (s *system) post(ctx context.Context, url string, body []byte, hdr map[string]string, want int) (*tc.Response, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(http.MethodPost)
	req.SetRequestURI(url)
	req.SetBodyRaw(body)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(60 * time.Second)
	}
	start := time.Now()
	if err := s.fast.DoDeadline(req, resp, dl); err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	r := &tc.Response{Method: http.MethodPost, URL: url, Status: resp.StatusCode(),
		Body: append([]byte(nil), resp.Body()...), Elapsed: time.Since(start)}
	return r, r.Expect(want)
}

// batchMsg is one message of a messages:batch body.
type batchMsg struct {
	Value          string `json:"value"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	DelayMs        int64  `json:"delay_ms,omitempty"`
}

// batchBody renders a messages:batch body.
func batchBody(msgs []batchMsg) []byte {
	b, err := json.Marshal(map[string]any{"messages": msgs})
	if err != nil {
		panic(err)
	}
	return b
}

// publishBatch posts one messages:batch body of n messages and checks that
// every one was stored.
func (s *system) publishBatch(ctx context.Context, topic string, body []byte, n int) error {
	r, err := s.post(ctx, s.url(topic, "/messages:batch"), body, nil, http.StatusOK)
	if err != nil {
		return err
	}
	var res struct {
		Results []tc.PublishResult `json:"results"`
	}
	if err := r.JSON(&res); err != nil {
		return err
	}
	if len(res.Results) != n {
		return fmt.Errorf("batch of %d answered %d results", n, len(res.Results))
	}
	return nil
}

// backlog publishes n messages of size bytes to topic in batches of 1000,
// four requests at a time.
func (s *system) backlog(b *testing.B, topic string, n, size int) {
	b.Helper()
	val := string(payload(size))
	full := make([]batchMsg, 1000)
	for i := range full {
		full[i] = batchMsg{Value: val}
	}
	fullBody := batchBody(full)
	var next atomic.Int64
	d := driver{workers: 4, next: func() (int64, bool) {
		i := next.Add(1000) - 1000
		return i, i < int64(n)
	}}
	_, _, _, err := d.run(func(_ int, i int64) (int, error) {
		k := min(1000, n-int(i))
		body := fullBody
		if k < 1000 {
			body = batchBody(full[:k])
		}
		return k, s.publishBatch(context.Background(), topic, body, k)
	})
	if err != nil {
		b.Fatalf("publishing a backlog of %d: %v", n, err)
	}
}

// driver runs a closed loop: workers goroutines each take the next
// operation and run it, one at a time, until next says there is none.
type driver struct {
	workers int
	next    func() (int64, bool)
}

// run returns the messages the operations handled, the latency of each
// operation, and the time from the start until the last worker finished.
// A failed operation stops nothing; run reports how many failed and the
// first error.
func (d driver) run(op func(worker int, i int64) (msgs int, err error)) (msgs int64, lat []time.Duration, elapsed time.Duration, err error) {
	var (
		total   atomic.Int64
		failed  atomic.Int64
		first   atomic.Value
		mu      sync.Mutex
		wg      sync.WaitGroup
		started = time.Now()
	)
	for w := range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			for {
				i, ok := d.next()
				if !ok {
					break
				}
				t0 := time.Now()
				n, err := op(w, i)
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				local = append(local, time.Since(t0))
				total.Add(int64(n))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed = time.Since(started)
	if n := failed.Load(); n > 0 {
		err = fmt.Errorf("%d operations failed; first: %v", n, first.Load())
	}
	return total.Load(), lat, elapsed, err
}

// untilN hands out 0..n-1.
func untilN(n int) func() (int64, bool) {
	var next atomic.Int64
	return func() (int64, bool) {
		i := next.Add(1) - 1
		return i, i < int64(n)
	}
}

// until hands out 0, 1, ... until the deadline.
func until(deadline time.Time) func() (int64, bool) {
	var next atomic.Int64
	return func() (int64, bool) { return next.Add(1) - 1, time.Now().Before(deadline) }
}

// metric is one b.ReportMetric value.
type metric struct {
	v    float64
	unit string
}

// latencyMetrics are the p50, p99 and p999 of lat in ms, units prefixed.
func latencyMetrics(prefix string, lat []time.Duration) []metric {
	s := slices.Clone(lat)
	slices.Sort(s)
	return []metric{
		{ms(percentile(s, 0.50)), prefix + "p50_ms"},
		{ms(percentile(s, 0.99)), prefix + "p99_ms"},
		{ms(percentile(s, 0.999)), prefix + "p999_ms"},
	}
}

// report reports ms and hides ns/op (a whole-system figure per b.N is
// meaningless; the rates and percentiles are the result).
func report(b *testing.B, ms []metric) {
	for _, m := range ms {
		b.ReportMetric(m.v, m.unit)
	}
	b.ReportMetric(0, "ns/op")
}

// fixedResults remembers the figures of fixed-workload benchmarks by name.
var fixedResults sync.Map

// fixed runs a benchmark whose workload is set by its own flags (a
// duration, a message count), not by b.N. The testing package calls a
// benchmark with b.N = 1 first, and under -benchtime Nx (or when the first
// call was shorter than -benchtime) again with a larger b.N: the workload
// runs on the b.N = 1 call and later calls report the same figures again
// instead of repeating minutes of work. Each -count round starts with
// b.N = 1, so it measures anew.
func fixed(b *testing.B, run func(b *testing.B) []metric) {
	b.Helper()
	if v, ok := fixedResults.Load(b.Name()); ok && b.N > 1 {
		report(b, v.([]metric))
		return
	}
	start := time.Now()
	ms := run(b)
	fixedResults.Store(b.Name(), ms)
	report(b, ms)
	// Under a -benchtime duration, a run shorter than it would make the
	// testing package call again with a larger b.N, and print that: pad it.
	if f := flag.Lookup("test.benchtime"); f != nil && !strings.HasSuffix(f.Value.String(), "x") {
		if d, err := time.ParseDuration(f.Value.String()); err == nil {
			time.Sleep(d - time.Since(start))
		}
	}
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

const mib = 1 << 20

// goHeap returns this process's HeapInuse and HeapAlloc after two GCs: a
// sync.Pool's contents survive one (bbolt keeps the page buffers of its last
// commit in one: tens of MiB after a transaction of 100k random inserts).
func goHeap() (inuse, alloc uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.HeapAlloc
}

// nodeHeap makes node n collect its garbage twice (GET
// /debug/pprof/heap?gc=1 runs runtime.GC before it writes the profile; see
// goHeap for why twice) and then reads its go_memstats_heap_inuse_bytes and
// go_memstats_heap_alloc_bytes from GET /metrics.
func nodeHeap(n *tc.Node) (inuse, alloc float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r *tc.Response
	for range 2 {
		if r, err = n.Do(ctx, http.MethodGet, "/debug/pprof/heap?gc=1", nil, nil); err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if r, err = n.Do(ctx, http.MethodGet, "/metrics", nil, nil); err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		return 0, 0, err
	}
	found := 0
	for _, line := range strings.Split(string(r.Body), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || (name != "go_memstats_heap_inuse_bytes" && name != "go_memstats_heap_alloc_bytes") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("metrics: %q: %w", line, err)
		}
		if name == "go_memstats_heap_inuse_bytes" {
			inuse = v
		} else {
			alloc = v
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("metrics: go_memstats_heap_inuse_bytes or go_memstats_heap_alloc_bytes missing")
	}
	return inuse, alloc, nil
}
