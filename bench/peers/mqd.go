package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// ---- building and running a three-node mqd cluster ----

// repoRoot walks up from the working directory to the directory whose go.mod
// declares module github.com/mqd/mqd (this program's own go.mod is skipped).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) == 2 && f[0] == "module" && f[1] == "github.com/mqd/mqd" {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of module github.com/mqd/mqd above the working directory (run from inside the repository, or pass -mqd-bin)")
		}
		dir = parent
	}
}

// buildMqd builds ./cmd/mqd of the repository into dir and returns its path.
// The file is named "peersbench-broker", without "mqd" in it, so that a
// `pkill mqd` aimed at someone's hand-started cluster leaves it alone.
func buildMqd(ctx context.Context, dir string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "peersbench-broker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/mqd")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/mqd in %s: %v\n%s", root, err, b)
	}
	return out, nil
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1. They are free
// when this returns, not guaranteed to stay so: callers retry on a clash.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

type mqdNode struct {
	id, httpAddr, raftAddr, dataDir string
	proc                            *child
}

type mqdCluster struct {
	label  string // "mqd" or "mqd-base"
	nodes  []*mqdNode
	leader string // base URL of the leader, "http://host:port"
	client *fasthttp.Client
	// topicLeaders: topic → base URL of the node leading its data group
	// (data groups are mqd's default: a topic's leader is often not the
	// cluster's), as JetStream's clients connect to the stream leader.
	topicLeaders sync.Map
}

// newHTTPClient is fasthttp's client: the benchmark shares the machine's
// two cores with the brokers, and it used about 14 µs of CPU per request
// here against net/http's 40 µs.
func newHTTPClient() *fasthttp.Client {
	return &fasthttp.Client{
		MaxConnsPerHost:          1024,
		NoDefaultUserAgentHeader: true,
		ReadTimeout:              30 * time.Second,
		WriteTimeout:             30 * time.Second,
	}
}

// startMqd starts three mqd processes of bin under dir and waits for a
// leader. A clash on a port (someone else grabbed it between reservation and
// bind) is retried with fresh ports.
func startMqd(ctx context.Context, label, bin, dir string) (*mqdCluster, error) {
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		d := filepath.Join(dir, fmt.Sprintf("attempt%d", attempt))
		c, err := startMqdOnce(ctx, label, bin, d)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		logf("%s: cluster start failed (attempt %d): %v", label, attempt, err)
	}
	return nil, lastErr
}

func startMqdOnce(ctx context.Context, label, bin, dir string) (*mqdCluster, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	c := &mqdCluster{label: label, client: newHTTPClient()}
	var httpAddrs []string
	for i := range 3 {
		n := &mqdNode{
			id:       fmt.Sprintf("n%d", i+1),
			httpAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			raftAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
		}
		n.dataDir = filepath.Join(dir, n.id)
		httpAddrs = append(httpAddrs, n.httpAddr)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := os.MkdirAll(n.dataDir, 0o755); err != nil {
			c.stop()
			return nil, err
		}
		p, err := startChild(label+" "+n.id, bin, []string{"--id", n.id, "--data-dir", n.dataDir, "--http-addr", n.httpAddr,
			"--raft-addr", n.raftAddr, "--bootstrap-expect", "3", "--join", strings.Join(httpAddrs, ",")},
			filepath.Join(dir, n.id+".log"))
		if err != nil {
			c.stop()
			return nil, err
		}
		n.proc = p
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		c.stop()
		return nil, fmt.Errorf("%w\n%s", err, logTails(c.procs(), 15))
	}
	return c, nil
}

// procs are the node processes started so far.
func (c *mqdCluster) procs() []*child {
	var ps []*child
	for _, n := range c.nodes {
		if n.proc != nil {
			ps = append(ps, n.proc)
		}
	}
	return ps
}

func (c *mqdCluster) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ready := 0
		for _, n := range c.nodes {
			if n.proc.exited() {
				return fmt.Errorf("%s node %s exited during startup", c.label, n.id)
			}
			if st, _, err := c.get(ctx, "http://"+n.httpAddr+"/readyz"); err == nil && st == http.StatusOK {
				ready++
			}
		}
		if ready == len(c.nodes) {
			var info struct {
				Leader *struct {
					HTTPAddr string `json:"http_addr"`
				} `json:"leader"`
			}
			if st, body, err := c.get(ctx, "http://"+c.nodes[0].httpAddr+"/v1/cluster"); err == nil && st == http.StatusOK &&
				json.Unmarshal(body, &info) == nil && info.Leader != nil && info.Leader.HTTPAddr != "" {
				c.leader = "http://" + info.Leader.HTTPAddr
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s cluster not ready after %v", c.label, timeout)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// stop sends SIGTERM to every node, waits up to 10 s, then SIGKILLs.
func (c *mqdCluster) stop() {
	if c == nil {
		return
	}
	stopChildren(c.procs(), 10*time.Second)
}

// ---- HTTP helpers ----

func (c *mqdCluster) do(ctx context.Context, method, url string, body []byte, hdr map[string]string) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(url)
	if body != nil {
		req.SetBodyRaw(body)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	if err := c.client.DoDeadline(req, resp, dl); err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

func (c *mqdCluster) get(ctx context.Context, url string) (int, []byte, error) {
	return c.do(ctx, http.MethodGet, url, nil, nil)
}

// expect sends a request to the leader of path's topic (to the cluster's
// leader for other paths, or a topic without a data group) and checks its
// status is one of want.
func (c *mqdCluster) expect(ctx context.Context, method, path string, body []byte, hdr map[string]string, want ...int) ([]byte, error) {
	base := c.leader
	if rest, ok := strings.CutPrefix(path, "/v1/topics/"); ok {
		topic, _, _ := strings.Cut(rest, "/")
		if l, ok := c.topicLeaders.Load(topic); ok {
			base = l.(string)
		}
	}
	st, b, err := c.do(ctx, method, base+path, body, hdr)
	if err != nil {
		return nil, err
	}
	for _, w := range want {
		if st == w {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%s %s: status %d: %.300s", method, path, st, b)
}

// createTopic creates topic and finds its leader: for a topic in a data
// group, the group's preferred leader (its first replica), once the group
// has handed leadership to it (within a few seconds of its creation).
func (c *mqdCluster) createTopic(ctx context.Context, topic string) error {
	// A creation may meet an election or a group's hand-off to its
	// preferred leader (503, Retry-After: 1), which any client retries.
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, b, err := c.do(ctx, http.MethodPut, c.leader+"/v1/topics/"+topic, nil, nil)
		if err == nil && (st == http.StatusCreated || st == http.StatusOK) {
			break
		}
		if err == nil && st != http.StatusServiceUnavailable {
			return fmt.Errorf("PUT /v1/topics/%s: status %d: %.300s", topic, st, b)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PUT /v1/topics/%s: status %d (%v): %.300s", topic, st, err, b)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	var p struct {
		Placement *struct {
			Group    string   `json:"group"`
			Replicas []string `json:"replicas"`
			Leader   string   `json:"leader"`
		} `json:"placement"`
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		b, err := c.expect(ctx, http.MethodGet, "/v1/topics/"+topic, nil, nil, http.StatusOK)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("topic %s: %w", topic, err)
		}
		pl := p.Placement
		if pl == nil || pl.Group == "" {
			return nil // an older binary, or the metadata group: the cluster's leader
		}
		if pl.Leader != "" && (pl.Leader == pl.Replicas[0] || time.Now().After(deadline)) {
			for _, n := range c.nodes {
				if n.id == pl.Leader {
					c.topicLeaders.Store(topic, "http://"+n.httpAddr)
					logf("%s: topic %s in data group %s, led by %s", c.label, topic, pl.Group, n.id)
					return nil
				}
			}
			return fmt.Errorf("topic %s: leader %s is not a node of this cluster", topic, pl.Leader)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: data group %s has no leader after 20 s", topic, pl.Group)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// ---- workloads ----

// mqdSystem runs the workloads against a started mqd cluster.
type mqdSystem struct {
	c   *mqdCluster
	cfg *config
	seq atomic.Int64 // topic and key uniqueness
}

func (s *mqdSystem) name() string { return s.c.label }

func (s *mqdSystem) topic(w string) string {
	return fmt.Sprintf("peers-%s-%d", w, s.seq.Add(1))
}

// publish: publishers concurrent POST .../messages, each waiting for its 201.
func (s *mqdSystem) publish(ctx context.Context, wl string, publishers int, idem bool) (*result, error) {
	topic := s.topic(wl)
	if err := s.c.createTopic(ctx, topic); err != nil {
		return nil, err
	}
	path := "/v1/topics/" + topic + "/messages"
	body := payload(s.cfg.size)
	var keys atomic.Int64
	prefix := fmt.Sprintf("%s-%d-", topic, time.Now().UnixNano())
	r := closedLoop(ctx, publishers, s.cfg.warmup, s.cfg.duration, func(ctx context.Context, _ int) (int, error) {
		var hdr map[string]string
		if idem {
			hdr = map[string]string{"Idempotency-Key": prefix + strconv.FormatInt(keys.Add(1), 10)}
		}
		b, err := s.c.expect(ctx, http.MethodPost, path, body, hdr, http.StatusCreated)
		if err != nil {
			return 0, err
		}
		if idem && bytes.Contains(b, []byte(`"duplicate":true`)) {
			return 0, errors.New("unique key answered as duplicate")
		}
		return 1, nil
	})
	return r, nil
}

// batchBody is a messages:batch body of n messages of the given payload.
func batchBody(n int, p []byte) []byte {
	type m struct {
		Value string `json:"value"`
	}
	msgs := make([]m, n)
	for i := range msgs {
		msgs[i].Value = string(p)
	}
	b, _ := json.Marshal(map[string]any{"messages": msgs})
	return b
}

// batch: -batch-concurrency concurrent POST .../messages:batch of
// -batch-size messages each, each waiting for its 200.
func (s *mqdSystem) batch(ctx context.Context, wl string) (*result, error) {
	topic := s.topic(wl)
	if err := s.c.createTopic(ctx, topic); err != nil {
		return nil, err
	}
	path := "/v1/topics/" + topic + "/messages:batch"
	body := batchBody(s.cfg.batchSize, payload(s.cfg.size))
	n := s.cfg.batchSize
	return closedLoop(ctx, s.cfg.batchConc, s.cfg.warmup, s.cfg.duration, func(ctx context.Context, _ int) (int, error) {
		if _, err := s.c.expect(ctx, http.MethodPost, path, body, nil, http.StatusOK); err != nil {
			return 0, err
		}
		return n, nil
	}), nil
}

// consume: pre-load, then consumers in one group fetch up to -fetch messages
// (waiting up to 1 s) and ack them in one request, until every pre-loaded
// message is acked or -duration has passed.
func (s *mqdSystem) consume(ctx context.Context, wl string, consumers int) (*result, error) {
	topic := s.topic(wl)
	if err := s.c.createTopic(ctx, topic); err != nil {
		return nil, err
	}
	total := s.cfg.consumeMsgs
	if err := s.preload(ctx, topic, total); err != nil {
		return nil, fmt.Errorf("pre-load: %w", err)
	}
	base := "/v1/topics/" + topic + "/groups/bench"
	if _, err := s.c.expect(ctx, http.MethodPut, base, nil, nil, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	fetchBody := []byte(fmt.Sprintf(`{"max":%d,"wait_ms":1000}`, s.cfg.fetch))
	return consumeLoop(ctx, consumers, total, s.cfg.duration, func(ctx context.Context) (int, error) {
		b, err := s.c.expect(ctx, http.MethodPost, base+"/fetch", fetchBody, nil, http.StatusOK)
		if err != nil {
			return 0, err
		}
		var fr struct {
			Messages []struct {
				Receipt string `json:"receipt"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(b, &fr); err != nil {
			return 0, err
		}
		if len(fr.Messages) == 0 {
			return 0, nil
		}
		rc := make([]string, len(fr.Messages))
		for i, m := range fr.Messages {
			rc[i] = m.Receipt
		}
		ab, _ := json.Marshal(map[string]any{"receipts": rc})
		b, err = s.c.expect(ctx, http.MethodPost, base+"/ack", ab, nil, http.StatusOK)
		if err != nil {
			return 0, err
		}
		var ar struct {
			Results []struct {
				Status string `json:"status"`
			} `json:"results"`
		}
		if err := json.Unmarshal(b, &ar); err != nil {
			return 0, err
		}
		ok := 0
		for _, x := range ar.Results {
			if x.Status == "ok" {
				ok++
			}
		}
		if ok != len(rc) {
			return ok, fmt.Errorf("ack: %d of %d receipts not ok", len(rc)-ok, len(rc))
		}
		return ok, nil
	}), nil
}

// preload stores n messages with 4 concurrent batches of up to 1000.
func (s *mqdSystem) preload(ctx context.Context, topic string, n int) error {
	const per = 1000
	full := batchBody(per, payload(s.cfg.size))
	path := "/v1/topics/" + topic + "/messages:batch"
	var next atomic.Int64
	var wg sync.WaitGroup
	var errs errCounter
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				hi := next.Add(per)
				lo := hi - per
				if lo >= int64(n) {
					return
				}
				body := full
				if hi > int64(n) {
					body = batchBody(int(int64(n)-lo), payload(s.cfg.size))
				}
				if _, err := s.c.expect(ctx, http.MethodPost, path, body, nil, http.StatusOK); err != nil {
					errs.add(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if errs.n.Load() > 0 {
		return errors.New(errs.first.Load().(string))
	}
	return ctx.Err()
}

// consumeLoop runs consumers goroutines calling cycle (fetch + ack, answering
// the messages acked) until total messages are acked or dur has passed; the
// rate is acked messages over the time that took.
func consumeLoop(ctx context.Context, consumers, total int, dur time.Duration, cycle func(ctx context.Context) (int, error)) *result {
	start := time.Now()
	cpu0, cpuOK := readBrokerCPU()
	deadline := start.Add(dur)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var (
		acked  atomic.Int64
		errs   errCounter
		doneAt atomic.Int64 // ns since start when the last message was acked
		wg     sync.WaitGroup
	)
	for range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && acked.Load() < int64(total) {
				n, err := cycle(ctx)
				if n > 0 && acked.Add(int64(n)) >= int64(total) {
					doneAt.CompareAndSwap(0, int64(time.Since(start)))
					cancel()
				}
				// A request cut off by the deadline (its HTTP client may
				// notice a moment before ctx does) is not a failure.
				if err != nil && ctx.Err() == nil && time.Now().Before(deadline) {
					errs.add(err)
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Duration(doneAt.Load())
	if el == 0 {
		el = time.Since(start)
		if el > dur {
			el = dur
		}
	}
	r := &result{msgs: acked.Load(), elapsed: el}
	if cpu1, ok := readBrokerCPU(); ok && cpuOK && cpu1 > cpu0 {
		r.cpu = cpu1 - cpu0 // until the last worker stopped: a little past el
	}
	if r.msgs < int64(total) {
		r.note = fmt.Sprintf("acked %d of %d pre-loaded messages in the %v allowed", r.msgs, total, dur)
	}
	errs.fill(r)
	return r
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
