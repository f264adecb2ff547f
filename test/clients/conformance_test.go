package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/internal/faultproxy"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// The client conformance suite: every case of clients/conformance/cases.json
// run by every client's driver (Go, Python, Node.js, Java) against one real
// 3-node cluster behind a fault proxy per node, printing a case × language
// table. A language whose toolchain is missing is skipped, or fails the test
// when MQD_EXAMPLES_REQUIRED=1 or CI is set. With MQD_CONFORMANCE_BREAKS=1
// each case runs a second time with the rule it checks switched off in the
// client (MQD_CLIENT_BREAK=<broken_by>) and must fail then.
func TestClientConformance(t *testing.T) {
	t.Parallel()
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cases := loadConformanceCases(t, filepath.Join(root, "clients", "conformance", "cases.json"))
	drivers := conformanceDrivers(t, root)
	if len(drivers) == 0 {
		t.Fatal("no driver could be prepared")
	}
	c := tc.Start(t, 3)
	for _, n := range c.Nodes() { // process is refused (503) until the state format is raised
		if _, err := tc.WaitView(tc.CtxFor(t, 30*time.Second), n, "state format 3", func(ci tc.ClusterInfo) bool {
			return ci.StateFormat >= fsm.ProcessFormat
		}); err != nil {
			t.Fatal(err)
		}
	}
	s := &conformanceSuite{t: t, c: c, set: &faultproxy.Set{}}
	for i, n := range c.Nodes() {
		p, err := faultproxy.New(s.set, i, n.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		s.proxies = append(s.proxies, p)
	}
	s.set.OnKill = func(i int) { s.proxies[i].Down(); c.Node(i).Kill() }
	modes := []bool{false}
	if os.Getenv("MQD_CONFORMANCE_BREAKS") == "1" {
		modes = append(modes, true)
	}
	start := time.Now()
	table := map[string]map[string]string{}
	for _, broken := range modes {
		for _, cs := range cases {
			row := cs.Name
			if broken {
				row = cs.Name + " (" + cs.BrokenBy + " broken)"
			}
			table[row] = map[string]string{}
			for _, d := range drivers {
				t.Run(cs.Name+"/"+d.lang+map[bool]string{true: "/broken"}[broken], func(t *testing.T) {
					table[row][d.lang] = verdict(t, cs, d.lang, broken, s.run(t, cs, d, broken))
				})
			}
		}
	}
	out := conformanceTable(cases, drivers, table, modes)
	t.Logf("client conformance, %d cases × %d languages in %v:\n%s", len(cases), len(drivers), time.Since(start).Round(time.Second), out)
	if p := os.Getenv("MQD_CONFORMANCE_TABLE"); p != "" {
		if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// verdict turns a case's problems into its table cell, failing t when the
// case failed, or passed with its rule broken.
func verdict(t *testing.T, cs conformanceCase, lang string, broken bool, problems []string) string {
	switch {
	case !broken && len(problems) == 0:
		return "pass"
	case !broken:
		t.Errorf("%s with the %s client:\n  %s", cs.Name, lang, strings.Join(problems, "\n  "))
		return "FAIL"
	case len(problems) > 0:
		t.Logf("%s broken, as expected:\n  %s", cs.BrokenBy, strings.Join(problems, "\n  "))
		return "caught"
	}
	t.Errorf("%s passed with %s broken in the %s client: the case cannot catch it", cs.Name, cs.BrokenBy, lang)
	return "MISSED"
}

type conformanceCase struct {
	Name        string             `json:"name"`
	Rule        string             `json:"rule"`
	BrokenBy    string             `json:"broken_by"`
	FirstServer string             `json:"first_server"`
	Client      map[string]any     `json:"client"`
	Setup       conformanceSetup   `json:"setup"`
	Faults      []faultproxy.Rule  `json:"faults"`
	Steps       []map[string]any   `json:"steps"`
	Requests    []conformanceReqs  `json:"requests"`
	Topic       *conformanceTopicX `json:"topic"`
}

type conformanceSetup struct {
	Topic   map[string]any `json:"topic"`
	Publish []struct {
		Value string `json:"value"`
		Key   string `json:"key"`
	} `json:"publish"`
}

// conformanceReqs checks the requests the proxies received for one route.
type conformanceReqs struct {
	Method       string   `json:"method"`
	Path         string   `json:"path"`
	Count        *int     `json:"count"`
	MinCount     int      `json:"min_count"`
	MaxCount     int      `json:"max_count"` // 0: no bound
	SameHeader   string   `json:"same_header"`
	SameHeaders  []string `json:"same_headers"`
	SameBody     bool     `json:"same_body"`
	MinGapMs     int      `json:"min_gap_ms"`
	MinProxies   int      `json:"min_proxies"`
	BodyContains string   `json:"body_contains"`
}

// conformanceTopicX is the broker's state expected after a case.
type conformanceTopicX struct {
	Messages *int64 `json:"messages"`
	Stored   *int64 `json:"stored"` // offsets ever given out (what retention deleted included)
	Group    string `json:"group"`
	Acked    *int64 `json:"acked"`
}

func loadConformanceCases(t *testing.T, path string) []conformanceCase {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []json.RawMessage `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []conformanceCase
	for _, raw := range f.Cases {
		var cs conformanceCase
		if err := json.Unmarshal(raw, &cs); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if cs.Name == "" || cs.BrokenBy == "" || len(cs.Steps) == 0 {
			t.Fatalf("%s: case %q needs a name, broken_by and steps", path, cs.Name)
		}
		out = append(out, cs)
	}
	return out
}

// conformanceDriver runs one language's driver: argv, in dir, with env.
type conformanceDriver struct {
	lang string
	argv []string
	env  []string
}

// conformanceDrivers prepares every driver whose toolchain is present.
func conformanceDrivers(t *testing.T, root string) []conformanceDriver {
	required := os.Getenv("MQD_EXAMPLES_REQUIRED") == "1" || os.Getenv("CI") != ""
	conf := filepath.Join(root, "clients", "conformance")
	tmp := t.TempDir()
	var out []conformanceDriver
	missing := func(lang, why string) {
		if required {
			t.Errorf("%s driver: %s (MQD_EXAMPLES_REQUIRED=1 or CI is set)", lang, why)
		} else {
			t.Logf("SKIP %s driver: %s (set MQD_EXAMPLES_REQUIRED=1 to fail instead)", lang, why)
		}
	}
	build := func(lang string, args ...string) bool {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s driver: %s: %v\n%s", lang, strings.Join(args, " "), err, b)
			return false
		}
		return true
	}
	goBin := filepath.Join(tmp, "conformance-go")
	if build("go", "go", "build", "-o", goBin, "./clients/conformance/go") {
		out = append(out, conformanceDriver{lang: "go", argv: []string{goBin}})
	}
	if _, err := exec.LookPath("python3"); err != nil {
		missing("python", "python3 is not installed")
	} else {
		out = append(out, conformanceDriver{lang: "python", argv: []string{"python3", filepath.Join(conf, "driver.py")},
			env: []string{"PYTHONPATH=" + filepath.Join(root, "clients", "python"), "PYTHONDONTWRITEBYTECODE=1"}})
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing("node", "node is not installed")
	} else {
		out = append(out, conformanceDriver{lang: "node", argv: []string{"node", filepath.Join(conf, "driver.mjs")}})
	}
	_, errc := exec.LookPath("javac")
	_, errj := exec.LookPath("java")
	if errc != nil || errj != nil {
		missing("java", "javac or java is not installed")
	} else {
		classes := filepath.Join(tmp, "java")
		srcs, _ := filepath.Glob(filepath.Join(root, "clients", "java", "src", "main", "java", "com", "github", "mqd", "client", "*.java"))
		args := append([]string{"javac", "-d", classes, filepath.Join(conf, "Driver.java")}, srcs...)
		if build("java", args...) {
			out = append(out, conformanceDriver{lang: "java", argv: []string{"java", "-cp", classes, "Driver"}})
		}
	}
	return out
}

type conformanceSuite struct {
	t       *testing.T
	c       *tc.Cluster
	set     *faultproxy.Set
	proxies []*faultproxy.Proxy
}

// run runs one case with one driver and returns what went wrong.
func (s *conformanceSuite) run(t *testing.T, cs conformanceCase, d conformanceDriver, broken bool) []string {
	topic := "cf-" + strings.ReplaceAll(cs.Name, "_", "-") + "-" + d.lang
	if broken {
		topic += "-broken"
	}
	cs = substituteTopic(t, cs, topic)
	ctx := tc.CtxFor(t, 2*time.Minute)
	leader := tc.MustLeader(t, s.c)
	cfg := map[string]any{"backoff_base_ms": 0, "backoff_jitter_ms": 0}
	for k, v := range cs.Setup.Topic {
		cfg[k] = v
	}
	tc.MustTopic(t, leader, topic, cfg)
	for _, m := range cs.Setup.Publish {
		tc.MustPublish(t, leader, topic, m.Value, map[string]string{"Idempotency-Key": m.Key})
	}
	defer s.heal(t)
	order := s.serverOrder(leader, cs.FirstServer)
	servers := make([]string, len(order))
	for i, idx := range order {
		servers[i] = s.proxies[idx].URL()
	}
	s.set.Reset(cs.Faults)
	lines, problems := s.drive(ctx, t, d, cs, servers, broken)
	records := s.set.Records()
	s.set.Reset(nil)
	for i, st := range cs.Steps {
		if i >= len(lines) {
			problems = append(problems, fmt.Sprintf("step %d (%v): no outcome", i+1, st["op"]))
			continue
		}
		if p := checkStep(st["expect"], lines[i]); p != "" {
			problems = append(problems, fmt.Sprintf("step %d (%v): %s", i+1, st["op"], p))
		}
	}
	for _, rq := range cs.Requests {
		problems = append(problems, checkRequests(rq, records)...)
	}
	if cs.Topic != nil {
		problems = append(problems, s.checkTopic(ctx, topic, *cs.Topic)...)
	}
	return problems
}

func substituteTopic(t *testing.T, cs conformanceCase, topic string) conformanceCase {
	b, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.ReplaceAll(b, []byte("$T"), []byte(topic))
	var out conformanceCase
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// serverOrder puts the leader first when the case asks, else a follower.
func (s *conformanceSuite) serverOrder(leader *tc.Node, first string) []int {
	var lead int
	for i, n := range s.c.Nodes() {
		if n == leader {
			lead = i
		}
	}
	others := []int{}
	for i := range s.proxies {
		if i != lead {
			others = append(others, i)
		}
	}
	if first == "leader" {
		return append([]int{lead}, others...)
	}
	return append(others, lead)
}

// heal restarts a node a case killed and waits for the whole cluster.
func (s *conformanceSuite) heal(t *testing.T) {
	for i, n := range s.c.Nodes() {
		if !n.Running() {
			n.Restart()
		}
		if err := s.proxies[i].Up(); err != nil {
			t.Error(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.c.WaitReady(ctx); err != nil {
		t.Fatalf("cluster not ready after the case: %v", err)
	}
}

// drive runs the driver on the case and returns its step outcomes.
func (s *conformanceSuite) drive(ctx context.Context, t *testing.T, d conformanceDriver, cs conformanceCase, servers []string, broken bool) ([]map[string]any, []string) {
	in, err := json.Marshal(map[string]any{"servers": servers, "client": cs.Client, "steps": cs.Steps})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, d.argv[0], d.argv[1:]...)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.Env = append(cmd.Env, "MQD_CLIENT_BREAK=")
	if broken {
		cmd.Env = append(cmd.Env, "MQD_CLIENT_BREAK="+cs.BrokenBy)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	started := time.Now()
	runErr := cmd.Run()
	t.Logf("%s driver ran %v", d.lang, time.Since(started).Round(10*time.Millisecond))
	var problems []string
	if runErr != nil {
		problems = append(problems, fmt.Sprintf("driver: %v; stderr: %s", runErr, strings.TrimSpace(stderr.String())))
	} else if stderr.Len() > 0 {
		t.Logf("%s driver stderr: %s", d.lang, stderr.String())
	}
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			problems = append(problems, fmt.Sprintf("driver printed %q: %v", l, err))
			continue
		}
		lines = append(lines, m)
	}
	return lines, problems
}

// checkStep compares a step's outcome with its expect object.
func checkStep(expect any, got map[string]any) string {
	want, _ := expect.(map[string]any)
	if want == nil {
		return ""
	}
	ok, _ := got["ok"].(bool)
	if wantOK, _ := want["ok"].(bool); wantOK != ok {
		return fmt.Sprintf("ok=%v, want %v (outcome %s)", ok, wantOK, compact(got))
	}
	if !ok {
		e, _ := got["error"].(map[string]any)
		if st, has := want["status"]; has && (e == nil || e["status"] != st) {
			return fmt.Sprintf("error %s, want status %v", compact(e), st)
		}
		if code, has := want["code"]; has && (e == nil || e["code"] != code) {
			return fmt.Sprintf("error %s, want code %v", compact(e), code)
		}
		return ""
	}
	if v, has := want["value"]; has {
		if p := subset(v, got["value"], "value"); p != "" {
			return p + " (outcome " + compact(got["value"]) + ")"
		}
	}
	return ""
}

// subset reports where got differs from want: maps by want's keys, lists
// element by element, "~s" as a substring.
func subset(want, got any, at string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: got %s, want an object", at, compact(got))
		}
		for k, wv := range w {
			if p := subset(wv, g[k], at+"."+k); p != "" {
				return p
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: got %s, want %s", at, compact(got), compact(want))
		}
		for i := range w {
			if p := subset(w[i], g[i], fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	case string:
		g, _ := got.(string)
		if sub, ok := strings.CutPrefix(w, "~"); ok {
			if !strings.Contains(g, sub) {
				return fmt.Sprintf("%s: %q does not contain %q", at, g, sub)
			}
		} else if g != w {
			return fmt.Sprintf("%s: got %s, want %q", at, compact(got), w)
		}
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Sprintf("%s: got %s, want %s", at, compact(got), compact(want))
		}
	}
	return ""
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// checkRequests checks what the proxies received on one route.
func checkRequests(rq conformanceReqs, records []faultproxy.Record) []string {
	var rs []faultproxy.Record
	for _, r := range records {
		if r.Method == rq.Method && r.Path == rq.Path {
			rs = append(rs, r)
		}
	}
	route := rq.Method + " " + rq.Path
	var p []string
	if rq.Count != nil && len(rs) != *rq.Count {
		p = append(p, fmt.Sprintf("%s: %d requests, want %d", route, len(rs), *rq.Count))
	}
	if len(rs) < rq.MinCount {
		p = append(p, fmt.Sprintf("%s: %d requests, want at least %d", route, len(rs), rq.MinCount))
	}
	if rq.MaxCount > 0 && len(rs) > rq.MaxCount {
		p = append(p, fmt.Sprintf("%s: %d requests, want at most %d", route, len(rs), rq.MaxCount))
	}
	headers := slices.Clone(rq.SameHeaders)
	if rq.SameHeader != "" {
		headers = append(headers, rq.SameHeader)
	}
	for _, h := range headers {
		vals := map[string]bool{}
		for _, r := range rs {
			vals[r.Header.Get(h)] = true
		}
		if len(rs) > 0 && (len(vals) != 1 || vals[""]) {
			p = append(p, fmt.Sprintf("%s: %s differs between attempts or is missing: %v", route, h, sortedKeys(vals)))
		}
	}
	proxies := map[int]bool{}
	for i, r := range rs {
		proxies[r.Proxy] = true
		if rq.SameBody && !bytes.Equal(r.Body, rs[0].Body) {
			p = append(p, fmt.Sprintf("%s: attempt %d sent %s, the first %s", route, i+1, r.Body, rs[0].Body))
		}
		if rq.BodyContains != "" && !bytes.Contains(r.Body, []byte(rq.BodyContains)) {
			p = append(p, fmt.Sprintf("%s: body %s does not contain %q", route, r.Body, rq.BodyContains))
		}
		if gap := time.Duration(0); i > 0 && rq.MinGapMs > 0 {
			if gap = r.At.Sub(rs[i-1].At); gap < time.Duration(rq.MinGapMs)*time.Millisecond {
				p = append(p, fmt.Sprintf("%s: attempt %d came %v after the previous one, want at least %d ms",
					route, i+1, gap.Round(time.Millisecond), rq.MinGapMs))
			}
		}
	}
	if len(proxies) < rq.MinProxies {
		p = append(p, fmt.Sprintf("%s: sent to %d nodes, want at least %d", route, len(proxies), rq.MinProxies))
	}
	return p
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkTopic compares the broker's view of the topic with what the case expects.
func (s *conformanceSuite) checkTopic(ctx context.Context, topic string, want conformanceTopicX) []string {
	leader, err := s.c.Leader(ctx)
	if err != nil {
		return []string{"no leader to check the topic: " + err.Error()}
	}
	st, err := leader.Stats(ctx, topic)
	if err != nil {
		return []string{"topic stats: " + err.Error()}
	}
	var p []string
	if want.Messages != nil && st.Messages != *want.Messages {
		p = append(p, fmt.Sprintf("topic holds %d messages, want %d", st.Messages, *want.Messages))
	}
	if want.Stored != nil && st.NextOffsets() != *want.Stored {
		p = append(p, fmt.Sprintf("topic stored %d messages in all, want %d", st.NextOffsets(), *want.Stored))
	}
	if want.Acked != nil && st.Groups[want.Group].Acked != *want.Acked {
		p = append(p, fmt.Sprintf("group %s acked %d, want %d", want.Group, st.Groups[want.Group].Acked, *want.Acked))
	}
	return p
}

// conformanceTable renders the case × language table as markdown.
func conformanceTable(cases []conformanceCase, drivers []conformanceDriver, table map[string]map[string]string, modes []bool) string {
	var b strings.Builder
	b.WriteString("| case |")
	for _, d := range drivers {
		b.WriteString(" " + d.lang + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(drivers)) + "\n")
	for _, broken := range modes {
		for _, cs := range cases {
			row := cs.Name
			if broken {
				row = cs.Name + " (" + cs.BrokenBy + " broken)"
			}
			b.WriteString("| " + row + " |")
			for _, d := range drivers {
				v := table[row][d.lang]
				if v == "" {
					v = "-"
				}
				b.WriteString(" " + v + " |")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
