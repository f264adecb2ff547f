package clients

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// pipelineOrders is how many orders the producer publishes.
const pipelineOrders = 100

// The three-stage pipeline of examples/pipeline against a real 3-node
// cluster: the Java producer publishes orders with idempotency keys; the
// Python stage (payments.py) turns each order into a payment with the
// Python client's process handler form; the Node.js stage
// (notifications.mjs) turns each payment into a notification likewise. The
// middle stage is killed with SIGKILL at random points (a random number of
// handlers into a run, then a random pause; every other kill just after a
// handler returned, around its process call) eight times and restarted.
// Then, with POST /v1/topics/{t}/reconcile and by reading every topic
// through a group of its own, every order must have exactly one payment and
// one notification (none missing, none stored twice), every input must be
// acked once in its stage's group, and no payment or notification may have
// been published a second time (GET /v1/topics/{t}/keys/{k}: duplicates 0).
// MQD_PIPELINE_SEPARATE=1 runs the middle stage with --separate (publish,
// then ack: two calls), which this test must catch.
func TestExamplesPipeline(t *testing.T) {
	t.Parallel()
	classes := requireExampleTools(t)
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 4*time.Minute)
	leader := tc.MustLeader(t, c)
	for _, n := range c.Nodes() { // process is refused (503) until the state format is raised
		if _, err := tc.WaitView(ctx, n, "state format 3", func(ci tc.ClusterInfo) bool { return ci.StateFormat >= fsm.ProcessFormat }); err != nil {
			t.Fatal(err)
		}
	}
	groups := map[string][]string{"orders": {"payments", "audit"}, "payments": {"notifications", "audit"}, "notifications": {"audit"}}
	for topic, gs := range groups {
		tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3, "backoff_base_ms": 200, "backoff_jitter_ms": 0})
		for _, g := range gs { // before publishing: retention keeps messages for them
			if r, err := leader.Do(ctx, "PUT", "/v1/topics/"+topic+"/groups/"+g, nil, nil); err != nil || (r.Status != 201 && r.Status != 200) {
				t.Fatalf("PUT group %s/%s: %v %+v", topic, g, err, r)
			}
		}
	}
	var urls []string
	for _, n := range c.Nodes() {
		urls = append(urls, n.URL())
	}
	servers := strings.Join(urls, ",")
	paymentsArgs := []string{"python3", "pipeline/payments.py"}
	if os.Getenv("MQD_PIPELINE_SEPARATE") == "1" {
		paymentsArgs = append(paymentsArgs, "--separate")
	}
	notes := startStage(ctx, t, servers, "notifications", "node", "pipeline/notifications.mjs")
	pay := startStage(ctx, t, servers, "payments", paymentsArgs...)
	var wg sync.WaitGroup
	wg.Add(1)
	produced := make(chan struct{})
	go func() {
		defer wg.Done()
		defer close(produced)
		out := runExample(ctx, t, servers, "java producer", "java", "-cp", classes, "pipeline/Orders.java", fmt.Sprint(pipelineOrders))
		if got := strings.Count(out, "duplicate=false"); got != pipelineOrders {
			t.Errorf("producer stored %d new orders, want %d:\n%s", got, pipelineOrders, out)
		}
	}()
	kills := 0
	for i := range 8 {
		// Half the kills anywhere in a handler's course, half around the
		// moment it settles (after "paid", when the stage calls process).
		line, pause := "handling ", time.Duration(rand.IntN(100))*time.Millisecond
		if i%2 == 1 {
			line, pause = "paid ", time.Duration(rand.IntN(30))*time.Millisecond
		}
		if !pay.killAfter(ctx, produced, line, 1+rand.IntN(6), pause) {
			break // nothing more to handle
		}
		kills++
		pay = startStage(ctx, t, servers, "payments", paymentsArgs...)
	}
	wg.Wait()
	t.Logf("killed the payments stage %d times", kills)
	if kills < 3 {
		t.Errorf("the payments stage was killed only %d times (it ran out of orders first)", kills)
	}
	orders, payKeys, noteKeys := pipelineKeys()
	waitReconciled(ctx, t, leader, "notifications", noteKeys, "")
	waitReconciled(ctx, t, leader, "payments", payKeys, "notifications")
	pay.stop(t)
	notes.stop(t)
	checkPipeline(ctx, t, leader, orders, payKeys, noteKeys)
}

// pipelineKeys are the keys every order must yield: the orders', their
// payments' and their notifications'.
func pipelineKeys() (orders, payments, notes []string) {
	for i := range pipelineOrders {
		k := fmt.Sprintf("order-%d", i)
		orders, payments, notes = append(orders, k), append(payments, "pay-"+k), append(notes, "note-"+k)
	}
	return
}

// checkPipeline checks the exactly-once outcome: reconcile, the topics'
// contents, the key traces, and the groups' ack counts.
func checkPipeline(ctx context.Context, t *testing.T, n *tc.Node, orders, payKeys, noteKeys []string) {
	chain := []struct {
		topic, group string
		keys         []string
	}{{"orders", "payments", orders}, {"payments", "notifications", payKeys}, {"notifications", "", noteKeys}}
	for _, s := range chain {
		rc := reconcile(ctx, t, n, s.topic, s.keys, s.group)
		if len(rc.Missing) > 0 {
			t.Errorf("%s: %d keys missing (lost): %v", s.topic, len(rc.Missing), rc.Missing)
		}
		if rc.Stored != len(s.keys) {
			t.Errorf("%s: reconcile counts %d keys stored, want %d", s.topic, rc.Stored, len(s.keys))
		}
		if s.group != "" {
			g := rc.Groups[s.group]
			if len(g.Acked) != len(s.keys) {
				t.Errorf("%s/%s: %d inputs acked, want all %d (pending %v, in flight %v, dead %v)",
					s.topic, s.group, len(g.Acked), len(s.keys), g.Pending, g.InFlight, g.Dead)
			}
			if st, err := n.Stats(ctx, s.topic); err != nil || st.Groups[s.group].Acked != int64(len(s.keys)) {
				t.Errorf("%s/%s: the group acked %d messages, want %d, each once (%v)", s.topic, s.group, st.Groups[s.group].Acked, len(s.keys), err)
			}
		}
		checkStoredOnce(ctx, t, n, s.topic, s.keys)
		if s.topic != "orders" {
			checkPublishedOnce(ctx, t, n, s.topic, s.keys)
		}
	}
}

// checkStoredOnce reads the whole topic through its "audit" group: every
// key of want exactly once, nothing else.
func checkStoredOnce(ctx context.Context, t *testing.T, n *tc.Node, topic string, want []string) {
	msgs, err := tc.Drain(ctx, n, topic, "audit", 2*time.Second)
	if err != nil {
		t.Errorf("reading %s: %v", topic, err)
		return
	}
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.IdempotencyKey]++
	}
	for _, k := range want {
		if seen[k] != 1 {
			t.Errorf("%s holds %s %d times, want exactly once", topic, k, seen[k])
		}
		delete(seen, k)
	}
	if len(seen) > 0 {
		t.Errorf("%s holds messages no order yields: %v", topic, seen)
	}
	if len(msgs) != len(want) {
		t.Errorf("%s: read %d messages, want %d", topic, len(msgs), len(want))
	}
}

// checkPublishedOnce checks, through the key trace, that no output was
// published a second time (a publish answered as a duplicate): each was
// written by exactly one process call.
func checkPublishedOnce(ctx context.Context, t *testing.T, n *tc.Node, topic string, keys []string) {
	again := 0
	for _, k := range keys {
		r, err := n.Do(ctx, "GET", "/v1/topics/"+topic+"/keys/"+url.PathEscape(k), nil, nil)
		var tr struct {
			Duplicates int `json:"duplicates"`
		}
		if err != nil || r.Status != 200 || r.JSON(&tr) != nil {
			t.Errorf("trace %s/%s: %v %+v", topic, k, err, r)
			continue
		}
		if tr.Duplicates > 0 {
			again++
			if again <= 5 {
				t.Errorf("%s: %s was published %d more time(s), answered as a duplicate: its input was handled more than once", topic, k, tr.Duplicates)
			}
		}
	}
	if again > 5 {
		t.Errorf("%s: %d keys in all were published more than once", topic, again)
	}
}

func reconcile(ctx context.Context, t *testing.T, n *tc.Node, topic string, keys []string, group string) tc.Reconciliation {
	body := map[string]any{"keys": keys}
	if group != "" {
		body["group"] = group
	}
	var rc tc.Reconciliation
	r, err := n.Do(ctx, "POST", "/v1/topics/"+topic+"/reconcile", body, nil)
	if err != nil || r.Status != 200 || r.JSON(&rc) != nil {
		t.Fatalf("reconcile %s: %v %+v", topic, err, r)
	}
	return rc
}

// waitReconciled waits (bounded) until every key is stored in topic and,
// with a group, acked by it.
func waitReconciled(ctx context.Context, t *testing.T, n *tc.Node, topic string, keys []string, group string) {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		rc := reconcile(ctx, t, n, topic, keys, group)
		if len(rc.Missing) == 0 && (group == "" || len(rc.Groups[group].Acked) == len(keys)) {
			return
		}
		select {
		case <-wctx.Done():
			t.Errorf("%s never reconciled: %d missing %v, %d acked by %q", topic, len(rc.Missing), rc.Missing, len(rc.Groups[group].Acked), group)
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// stage is one running stage of the pipeline, its stdout read line by line.
type stage struct {
	name    string
	cmd     *exec.Cmd
	lines   chan string
	stderr  *strings.Builder
	mu      sync.Mutex
	done    chan struct{}
	waitErr error
}

func startStage(ctx context.Context, t *testing.T, servers, name string, args ...string) *stage {
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Join(root, "examples")
	cmd.Env = append(os.Environ(), "MQD_SERVERS="+servers, "PYTHONDONTWRITEBYTECODE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s := &stage{name: name, cmd: cmd, lines: make(chan string, 1024), stderr: &strings.Builder{}, done: make(chan struct{})}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = lockedWriter{&s.mu, s.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s stage: %v", name, err)
	}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case s.lines <- sc.Text():
			default: // nobody counts lines any more
			}
		}
		s.waitErr = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
	})
	return s
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// killAfter waits for the stage's n-th line starting with prefix, waits
// pause, and kills it with SIGKILL; false when the stage ended, ctx did, or
// no such line came for 10 s once produced was closed (no more orders).
func (s *stage) killAfter(ctx context.Context, produced <-chan struct{}, prefix string, n int, pause time.Duration) bool {
	idle := time.NewTicker(10 * time.Second)
	defer idle.Stop()
	quiet := false
	for seen := 0; seen < n; {
		select {
		case l := <-s.lines:
			if strings.HasPrefix(l, prefix) {
				seen++
				quiet = false
			}
		case <-s.done:
			return false
		case <-ctx.Done():
			return false
		case <-idle.C:
			select {
			case <-produced:
				if quiet {
					return false
				}
				quiet = true // one more period: lines may still be on the way
			default:
			}
		}
	}
	time.Sleep(pause)
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	return true
}

// stop ends the stage with SIGTERM (its consumer loop settles what runs)
// and fails the test unless it exits cleanly.
func (s *stage) stop(t *testing.T) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Errorf("the %s stage did not stop within 30 s of SIGTERM", s.name)
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitErr != nil {
		t.Errorf("the %s stage: %v\nstderr:\n%s", s.name, s.waitErr, s.stderr.String())
	} else if s.stderr.Len() > 0 {
		t.Logf("the %s stage's reports:\n%s", s.name, s.stderr.String())
	}
}
