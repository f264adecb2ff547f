package clients

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// exampleTools are what the examples need. Without one the test skips,
// unless MQD_EXAMPLES_REQUIRED=1 (as .ci/run sets, having installed them).
var exampleTools = []string{"python3", "node", "java", "curl", "jq", "base64"}

// runExample runs one example program with MQD_SERVERS set to servers
// (and MQD_SERVER to the first of them) and returns its stdout; it fails the test on a non-zero exit.
func runExample(ctx context.Context, t *testing.T, servers, name string, args ...string) string {
	root, err := tc.RepoRoot()
	if err != nil {
		t.Error(err)
		return ""
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Join(root, "examples")
	first, _, _ := strings.Cut(servers, ",") // the raw examples talk to one node
	cmd.Env = append(os.Environ(), "MQD_SERVERS="+servers, "MQD_SERVER="+first, "PYTHONDONTWRITEBYTECODE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Errorf("%s (%s): %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// requireExampleTools skips (or fails, with MQD_EXAMPLES_REQUIRED=1 or CI)
// without the examples' tools, and compiles the Java client for them.
func requireExampleTools(t *testing.T) (javaClasses string) {
	for _, tool := range exampleTools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("MQD_EXAMPLES_REQUIRED") == "1" || os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed and MQD_EXAMPLES_REQUIRED=1 or CI is set", tool)
			}
			t.Skipf("%s is not installed (set MQD_EXAMPLES_REQUIRED=1 to fail instead)", tool)
		}
	}
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	javaClasses = t.TempDir()
	srcs, _ := filepath.Glob(filepath.Join(root, "clients", "java", "src", "main", "java", "com", "github", "mqd", "client", "*.java"))
	if b, err := exec.Command("javac", append([]string{"-d", javaClasses}, srcs...)...).CombinedOutput(); err != nil {
		t.Fatalf("compiling the Java client: %v\n%s", err, b)
	}
	return javaClasses
}

// The examples in four languages, with the clients and raw, against one
// real node, in three phases. Phase 1: the Python and Java client producers
// publish; a Python client consumer in group "billing" and a Java one in
// group "audit" each handle exactly those messages. Phase 2: the Node.js
// client and shell producers publish, and a shell re-run of the Python keys
// stores nothing (every answer a duplicate); a Node.js client consumer takes
// over "billing" and a shell one "audit", and each handles exactly the new
// messages, none of phase 1's again. Phase 3: the raw-HTTP producers of
// Python, Node.js and Java publish; the raw Python consumer takes "billing",
// the raw Java one "audit", and the raw Node.js one "ledger", a group that
// has consumed nothing yet and so handles every phase's messages. So every
// consumer is checked on its own, every message is handled (acked) exactly
// once per group across languages, and the "flaky" ones are nacked once and
// handled on redelivery.
func TestExamplesCrossLanguage(t *testing.T) {
	t.Parallel()
	classes := requireExampleTools(t)
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 5*time.Minute)
	const topic = "orders.examples"
	tc.MustTopic(t, n, topic, map[string]any{"partitions": 3, "backoff_base_ms": 200, "backoff_jitter_ms": 0})
	for _, g := range []string{"billing", "audit", "ledger"} { // before publishing: retention keeps messages for them
		if r, err := n.Do(ctx, "PUT", "/v1/topics/"+topic+"/groups/"+g, nil, nil); err != nil || (r.Status != 201 && r.Status != 200) {
			t.Fatalf("PUT group %s: %v %+v", g, err, r)
		}
	}
	ex := examples{t: t, servers: n.URL(), ctx: ctx, topic: topic, classes: classes, idle: "4"}
	phase1 := ex.produce(map[string]string{"py": "python", "java": "java", "flaky-py": "python"})
	ex.consume(map[string]bool{}, [][2]string{{"python", "billing"}, {"java", "audit"}}, phase1)
	phase2 := ex.produce(map[string]string{"node": "node", "sh": "shell", "flaky-node": "node"})
	out := ex.run("shell producer again", ex.producerCmd("shell", "py", examplesPerProducer)...)
	if got := strings.Count(out, "duplicate=true"); got != examplesPerProducer {
		t.Errorf("re-publishing py-* from the shell: %d duplicates, want %d:\n%s", got, examplesPerProducer, out)
	}
	ex.consume(map[string]bool{}, [][2]string{{"node", "billing"}, {"shell", "audit"}}, phase2)
	phase3 := ex.produce(map[string]string{"rpy": "python-raw", "rnode": "node-raw", "flaky-rjava": "java-raw"})
	all := map[string]bool{}
	for _, p := range []map[string]bool{phase1, phase2, phase3} {
		for k := range p {
			all[k] = true
		}
	}
	ex.consume(all, [][2]string{{"python-raw", "billing"}, {"java-raw", "audit"}, {"node-raw", "ledger"}}, phase3)
}

const examplesPerProducer = 6

type examples struct {
	t       *testing.T
	servers string // MQD_SERVERS
	ctx     context.Context
	topic   string
	classes string // the compiled Java client
	idle    string // seconds without a message before a consumer exits
}

func (e examples) run(name string, args ...string) string {
	return runExample(e.ctx, e.t, e.servers, name, args...)
}

func (e examples) producerCmd(lang, prefix string, count int) []string {
	c := fmt.Sprint(count)
	switch lang {
	case "python":
		return []string{"python3", "python/producer.py", e.topic, c, prefix}
	case "python-raw":
		return []string{"python3", "python/raw/producer.py", e.topic, c, prefix}
	case "node":
		return []string{"node", "node/producer.mjs", e.topic, c, prefix}
	case "node-raw":
		return []string{"node", "node/raw/producer.mjs", e.topic, c, prefix}
	case "java":
		return []string{"java", "-cp", e.classes, "java/ClientExample.java", "produce", e.topic, c, prefix}
	case "java-raw":
		return []string{"java", "java/raw/MqdExample.java", "produce", e.topic, c, prefix}
	}
	return []string{"bash", "shell/producer.sh", e.topic, c, prefix}
}

func (e examples) consumerCmd(lang, group string) []string {
	switch lang {
	case "python":
		return []string{"python3", "python/consumer.py", e.topic, group, e.idle}
	case "python-raw":
		return []string{"python3", "python/raw/consumer.py", e.topic, group, e.idle}
	case "node":
		return []string{"node", "node/consumer.mjs", e.topic, group, e.idle}
	case "node-raw":
		return []string{"node", "node/raw/consumer.mjs", e.topic, group, e.idle}
	case "java":
		return []string{"java", "-cp", e.classes, "java/ClientExample.java", "consume", e.topic, group, e.idle}
	case "java-raw":
		return []string{"java", "java/raw/MqdExample.java", "consume", e.topic, group, e.idle}
	}
	return []string{"bash", "shell/consumer.sh", e.topic, group, e.idle}
}

// produce runs a producer per key prefix (prefix → language) at once and
// returns the keys published; "flaky" prefixes publish 2 messages, others
// examplesPerProducer.
func (e examples) produce(prefixes map[string]string) map[string]bool {
	keys := map[string]bool{}
	var wg sync.WaitGroup
	for prefix, lang := range prefixes {
		count := examplesPerProducer
		if strings.HasPrefix(prefix, "flaky") {
			count = 2
		}
		for i := range count {
			keys[fmt.Sprintf("%s-%d", prefix, i)] = true
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := e.run(lang+" producer", e.producerCmd(lang, prefix, count)...)
			if got := strings.Count(out, "duplicate=false"); got != count {
				e.t.Errorf("%s producer %s: %d new messages, want %d:\n%s", lang, prefix, got, count, out)
			}
		}()
	}
	wg.Wait()
	if e.t.Failed() {
		e.t.FailNow()
	}
	return keys
}

// consume runs one consumer per (language, group) at once and checks that
// each handled exactly the keys of want (or, for a group in fresh, of
// fresh) once, and nacked the flaky ones.
func (e examples) consume(fresh map[string]bool, who [][2]string, want map[string]bool) {
	outs := make([]string, len(who))
	var wg sync.WaitGroup
	for i, lg := range who {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = e.run(lg[0]+" consumer", e.consumerCmd(lg[0], lg[1])...)
		}()
	}
	wg.Wait()
	for i, o := range outs {
		lang, group := who[i][0], who[i][1]
		w := want
		if len(fresh) > 0 && group == "ledger" {
			w = fresh
		}
		e.checkHandled(lang, group, o, w)
	}
}

// checkHandled checks one consumer's output: every key of want handled
// ("ok") exactly once, the flaky ones nacked first, nothing else handled.
func (e examples) checkHandled(lang, group, out string, want map[string]bool) {
	handled, nacked := map[string]int{}, map[string]int{}
	failed := false
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if f[1] != group {
			e.t.Errorf("%s consumer of %s printed a line for group %s: %q", lang, group, f[1], line)
			failed = true
			continue
		}
		switch f[0] {
		case "ok":
			handled[f[2]]++
		case "nack":
			nacked[f[2]]++
		}
	}
	for k := range want {
		if handled[k] != 1 {
			e.t.Errorf("%s consumer in group %s handled %s %d times, want exactly once", lang, group, k, handled[k])
			failed = true
		}
		if strings.HasPrefix(k, "flaky") && nacked[k] == 0 {
			e.t.Errorf("%s consumer in group %s never nacked %s (its first delivery fails)", lang, group, k)
			failed = true
		}
	}
	for k := range handled {
		if !want[k] {
			e.t.Errorf("%s consumer in group %s handled %s, which is not this phase's (handled twice in the group, or never published)", lang, group, k)
			failed = true
		}
	}
	if failed {
		e.t.Logf("%s consumer (%s) output:\n%s", lang, group, out)
	}
}

// The client-based examples survive the loss of the leader: on a 3-node
// cluster, the Python, Node.js and Java producers publish while a consumer
// per language (Python in "billing", Java in "audit", Node.js in "ledger")
// handles, and the leader is killed once a third of the messages are
// stored. Every producer must finish with all its keys published, and every
// consumer must handle every key exactly once. (The raw-HTTP examples talk to
// one node and are not expected to.)
func TestExamplesSurviveFailover(t *testing.T) {
	t.Parallel()
	classes := requireExampleTools(t)
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 4*time.Minute)
	leader := tc.MustLeader(t, c)
	const topic, count = "orders.failover", 60
	tc.MustTopic(t, leader, topic, map[string]any{"partitions": 3, "backoff_base_ms": 200, "backoff_jitter_ms": 0})
	for _, g := range []string{"billing", "audit", "ledger"} {
		if r, err := leader.Do(ctx, "PUT", "/v1/topics/"+topic+"/groups/"+g, nil, nil); err != nil || (r.Status != 201 && r.Status != 200) {
			t.Fatalf("PUT group %s: %v %+v", g, err, r)
		}
	}
	var urls []string
	for _, n := range c.Nodes() {
		urls = append(urls, n.URL())
	}
	ex := examples{t: t, servers: strings.Join(urls, ","), ctx: ctx, topic: topic, classes: classes, idle: "15"}
	prefixes := map[string]string{"fpy": "python", "fnode": "node", "fjava": "java"}
	want := map[string]bool{}
	for p := range prefixes {
		for i := range count {
			want[fmt.Sprintf("%s-%d", p, i)] = true
		}
	}
	var wg sync.WaitGroup
	consumers := [][2]string{{"python", "billing"}, {"java", "audit"}, {"node", "ledger"}}
	outs := make([]string, len(consumers))
	for i, lg := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = ex.run(lg[0]+" consumer", ex.consumerCmd(lg[0], lg[1])...)
		}()
	}
	for p, lang := range prefixes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := ex.run(lang+" producer", ex.producerCmd(lang, p, count)...)
			for i := range count {
				if !strings.Contains(out, fmt.Sprintf("published %s-%d ", p, i)) {
					t.Errorf("%s producer did not publish %s-%d:\n%s", lang, p, i, out)
					return
				}
			}
		}()
	}
	killLeaderAt(ctx, t, leader, topic, int64(len(want)/3))
	wg.Wait()
	for i, o := range outs {
		ex.checkHandled(consumers[i][0], consumers[i][1], o, want)
	}
}

// killLeaderAt kills leader once topic has stored at least n messages.
func killLeaderAt(ctx context.Context, t *testing.T, leader *tc.Node, topic string, n int64) {
	for {
		st, err := leader.Stats(ctx, topic)
		if err == nil && st.NextOffsets() >= n {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topic never reached %d messages before the kill: %v", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("killing the leader %s", leader)
	leader.Kill()
}
