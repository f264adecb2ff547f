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

// The examples in four languages against one real node: producers in
// Python, Node.js, Java and shell publish to one topic (a re-run stores
// nothing: every answer is a duplicate); group "billing" is consumed by
// Python and Node.js consumers competing, group "audit" by Java and shell
// ones. Every message is handled (acked) exactly once per group, and the
// "flaky" ones are nacked once and handled on redelivery.
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
	groups := []string{"billing", "audit"}
	for _, g := range groups { // before publishing: retention keeps messages for them
		if r, err := n.Do(ctx, "PUT", "/v1/topics/"+topic+"/groups/"+g, nil, nil); err != nil || (r.Status != 201 && r.Status != 200) {
			t.Fatalf("PUT group %s: %v %+v", g, err, r)
		}
	}

	const perProducer = 6
	producers := []struct{ name, prefix string }{
		{"python", "py"}, {"node", "node"}, {"java", "java"}, {"shell", "sh"}, {"python", "flaky-py"}, {"node", "flaky-node"},
	}
	cmdFor := map[string]func(prefix string, count int) []string{
		"python": func(p string, c int) []string {
			return []string{"python3", "python/producer.py", topic, fmt.Sprint(c), p}
		},
		"node": func(p string, c int) []string { return []string{"node", "node/producer.mjs", topic, fmt.Sprint(c), p} },
		"java": func(p string, c int) []string {
			return []string{"java", "java/MqdExample.java", "produce", topic, fmt.Sprint(c), p}
		},
		"shell": func(p string, c int) []string { return []string{"bash", "shell/producer.sh", topic, fmt.Sprint(c), p} },
	}
	want := map[string]bool{}
	var wg sync.WaitGroup
	for _, p := range producers {
		count := perProducer
		if strings.HasPrefix(p.prefix, "flaky") {
			count = 2
		}
		for i := range count {
			want[fmt.Sprintf("%s-%d", p.prefix, i)] = true
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := runExample(ctx, t, n, p.name+" producer", cmdFor[p.name](p.prefix, count)...)
			if got := strings.Count(out, "duplicate=false"); got != count {
				t.Errorf("%s producer %s: %d new messages, want %d:\n%s", p.name, p.prefix, got, count, out)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// The same keys again, from another language: nothing new is stored.
	out := runExample(ctx, t, n, "shell producer again", "bash", "shell/producer.sh", topic, fmt.Sprint(perProducer), "py")
	if got := strings.Count(out, "duplicate=true"); got != perProducer {
		t.Errorf("re-publishing py-* from the shell: %d duplicates, want %d:\n%s", got, perProducer, out)
	}

	consumers := []struct {
		name, group string
		args        []string
	}{
		{"python", "billing", []string{"python3", "python/consumer.py", topic, "billing", "4"}},
		{"node", "billing", []string{"node", "node/consumer.mjs", topic, "billing", "4"}},
		{"java", "audit", []string{"java", "java/MqdExample.java", "consume", topic, "audit", "4"}},
		{"shell", "audit", []string{"bash", "shell/consumer.sh", topic, "audit", "4"}},
	}
	outs := make([]string, len(consumers))
	for i, cs := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = runExample(ctx, t, n, cs.name+" consumer", cs.args...)
		}()
	}
	wg.Wait()
	handled := map[string]map[string]int{} // group → key → times acked
	nacked := map[string]map[string]int{}
	for _, g := range groups {
		handled[g], nacked[g] = map[string]int{}, map[string]int{}
	}
	byLang := map[string]int{}
	for i, o := range outs {
		for _, line := range strings.Split(strings.TrimSpace(o), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				continue
			}
			if f[1] != consumers[i].group {
				t.Errorf("%s consumer of %s printed a line for group %s: %q", consumers[i].name, consumers[i].group, f[1], line)
				continue
			}
			switch f[0] {
			case "ok":
				handled[f[1]][f[2]]++
				byLang[consumers[i].name]++
			case "nack":
				nacked[f[1]][f[2]]++
			}
		}
	}
	for _, g := range groups {
		for k := range want {
			if handled[g][k] != 1 {
				t.Errorf("group %s handled %s %d times, want exactly once", g, k, handled[g][k])
			}
			if strings.HasPrefix(k, "flaky") && nacked[g][k] == 0 {
				t.Errorf("group %s never nacked %s (its first delivery fails)", g, k)
			}
		}
		for k := range handled[g] {
			if !want[k] {
				t.Errorf("group %s handled %s, which was never published", g, k)
			}
		}
	}
	t.Logf("messages handled per consumer: %v", byLang)
	if t.Failed() {
		for i, o := range outs {
			t.Logf("%s consumer (%s) output:\n%s", consumers[i].name, consumers[i].group, o)
		}
	}
}
