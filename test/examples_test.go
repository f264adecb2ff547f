package test

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

// runExample runs one example program with MQD_SERVER pointing at n and
// returns its stdout; it fails the test on a non-zero exit.
func runExample(ctx context.Context, t *testing.T, n *tc.Node, name string, args ...string) string {
	root, err := tc.RepoRoot()
	if err != nil {
		t.Error(err)
		return ""
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Join(root, "examples")
	cmd.Env = append(os.Environ(), "MQD_SERVER="+n.URL())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Errorf("%s (%s): %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// The examples in four languages against one real node, in two phases.
// Phase 1: Python and Java producers publish; a Python consumer in group
// "billing" and a Java one in group "audit" each handle exactly those
// messages. Phase 2: Node.js and shell producers publish, and a shell re-run
// of the Python keys stores nothing (every answer a duplicate); a Node.js
// consumer takes over "billing" and a shell one "audit", and each handles
// exactly the new messages, none of phase 1's again. So every consumer is
// checked on its own, every message is handled (acked) exactly once per
// group across languages, and the "flaky" ones are nacked once and handled
// on redelivery.
func TestExamplesCrossLanguage(t *testing.T) {
	t.Parallel()
	for _, tool := range exampleTools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("MQD_EXAMPLES_REQUIRED") == "1" {
				t.Fatalf("%s is not installed and MQD_EXAMPLES_REQUIRED=1", tool)
			}
			t.Skipf("%s is not installed (set MQD_EXAMPLES_REQUIRED=1 to fail instead)", tool)
		}
	}
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := ctxFor(t, 5*time.Minute)
	const topic = "orders.examples"
	mustTopic(t, n, topic, map[string]any{"partitions": 3, "backoff_base_ms": 200, "backoff_jitter_ms": 0})
	for _, g := range []string{"billing", "audit"} { // before publishing: retention keeps messages for them
		if r, err := n.Do(ctx, "PUT", "/v1/topics/"+topic+"/groups/"+g, nil, nil); err != nil || (r.Status != 201 && r.Status != 200) {
			t.Fatalf("PUT group %s: %v %+v", g, err, r)
		}
	}
	ex := examples{t: t, n: n, ctx: ctx, topic: topic}
	phase1 := ex.produce(map[string]string{"py": "python", "java": "java", "flaky-py": "python"})
	ex.consume(phase1, "python", "billing", "java", "audit")
	phase2 := ex.produce(map[string]string{"node": "node", "sh": "shell", "flaky-node": "node"})
	out := ex.run("shell producer again", ex.producerCmd("shell", "py", examplesPerProducer)...)
	if got := strings.Count(out, "duplicate=true"); got != examplesPerProducer {
		t.Errorf("re-publishing py-* from the shell: %d duplicates, want %d:\n%s", got, examplesPerProducer, out)
	}
	ex.consume(phase2, "node", "billing", "shell", "audit")
}

const examplesPerProducer = 6

type examples struct {
	t     *testing.T
	n     *tc.Node
	ctx   context.Context
	topic string
}

func (e examples) run(name string, args ...string) string {
	return runExample(e.ctx, e.t, e.n, name, args...)
}

func (e examples) producerCmd(lang, prefix string, count int) []string {
	c := fmt.Sprint(count)
	switch lang {
	case "python":
		return []string{"python3", "python/producer.py", e.topic, c, prefix}
	case "node":
		return []string{"node", "node/producer.mjs", e.topic, c, prefix}
	case "java":
		return []string{"java", "java/MqdExample.java", "produce", e.topic, c, prefix}
	}
	return []string{"bash", "shell/producer.sh", e.topic, c, prefix}
}

func (e examples) consumerCmd(lang, group string) []string {
	const idle = "4" // seconds without a message before it exits
	switch lang {
	case "python":
		return []string{"python3", "python/consumer.py", e.topic, group, idle}
	case "node":
		return []string{"node", "node/consumer.mjs", e.topic, group, idle}
	case "java":
		return []string{"java", "java/MqdExample.java", "consume", e.topic, group, idle}
	}
	return []string{"bash", "shell/consumer.sh", e.topic, group, idle}
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

// consume runs one consumer in each of two groups at once and checks that
// each handled exactly the keys of want once, and nacked the flaky ones.
func (e examples) consume(want map[string]bool, lang1, group1, lang2, group2 string) {
	langs, groups := []string{lang1, lang2}, []string{group1, group2}
	outs := make([]string, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = e.run(langs[i]+" consumer", e.consumerCmd(langs[i], groups[i])...)
		}()
	}
	wg.Wait()
	for i, o := range outs {
		handled, nacked := map[string]int{}, map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			if f[1] != groups[i] {
				e.t.Errorf("%s consumer of %s printed a line for group %s: %q", langs[i], groups[i], f[1], line)
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
				e.t.Errorf("%s consumer in group %s handled %s %d times, want exactly once", langs[i], groups[i], k, handled[k])
			}
			if strings.HasPrefix(k, "flaky") && nacked[k] == 0 {
				e.t.Errorf("%s consumer in group %s never nacked %s (its first delivery fails)", langs[i], groups[i], k)
			}
		}
		for k := range handled {
			if !want[k] {
				e.t.Errorf("%s consumer in group %s handled %s, which is not this phase's (handled twice in the group, or never published)", langs[i], groups[i], k)
			}
		}
		if e.t.Failed() {
			e.t.Logf("%s consumer (%s) output:\n%s", langs[i], groups[i], o)
		}
	}
}
