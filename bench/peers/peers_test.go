package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestMain lets the test binary serve as a nats-server node, as the
// program does: startJS starts os.Executable() with natsNodeCmd.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == natsNodeCmd {
		os.Exit(natsNode(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func TestPickSystems(t *testing.T) {
	for _, tc := range []struct {
		flag     string
		haveBase bool
		want     string // "" with wantErr
		wantErr  bool
	}{
		{"", false, "mqd,js-default,js-always", false},
		{"", true, "mqd-base,mqd,js-default,js-always", false},
		{"js-always,mqd,mqd-base", true, "mqd-base,mqd,js-always", false},
		{"mqd-base", false, "", true},
		{"mqd,nats", false, "", true},
	} {
		got, err := pickSystems(tc.flag, tc.haveBase)
		if (err != nil) != tc.wantErr || strings.Join(got, ",") != tc.want {
			t.Errorf("pickSystems(%q, %v) = %q, %v; want %q, error %v", tc.flag, tc.haveBase, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestReportColumns: every system that ran has a column in the throughput
// and the CPU table, mqd is divided by each of the others (mqd-base too),
// and the lines fit in 120 columns.
func TestReportColumns(t *testing.T) {
	cfg := &config{duration: 5 * time.Second, warmup: time.Second, size: 1024, baseBin: "/tmp/old-mqd",
		batchSize: 100, batchConc: 4, asyncWindow: 256, consumeMsgs: 50000, consumers: 4, fetch: 100}
	systems := []string{"mqd-base", "mqd", "js-default", "js-always"}
	// msgs/s and msgs per CPU-second of each system, for every workload.
	rates := map[string][2]int64{
		"mqd-base": {2000, 4000}, "mqd": {3000, 6000}, "js-default": {12000, 24000}, "js-always": {4000, 3000},
	}
	results := map[string]map[string]*result{}
	for _, sys := range systems {
		results[sys] = map[string]*result{}
		for _, w := range allWorkloads() {
			r := rates[sys]
			results[sys][w.name] = &result{msgs: r[0] * 5, elapsed: 5 * time.Second,
				cpu: time.Duration(float64(time.Second) * float64(r[0]*5) / float64(r[1])),
				lat: []time.Duration{999 * time.Millisecond, 1999 * time.Millisecond}}
		}
	}
	// mqd's keyed publishes at c=16: 2700 msgs/s, 0.90 of plain.
	results["mqd"]["publish-16-idem"].msgs = 2700 * 5
	var out bytes.Buffer
	printReport(&out, cfg, allWorkloads(), systems, results, nil, []float64{10000, 14000}, 3*time.Minute, false)
	text := out.String()
	t.Logf("\n%s", text)

	for i, line := range strings.Split(text, "\n") {
		// The closing summary line is prose; the tables must fit.
		if strings.HasPrefix(line, "batch: ") {
			continue
		}
		if n := utf8.RuneCountInString(line); n > 120 {
			t.Errorf("line %d is %d columns wide: %q", i+1, n, line)
		}
	}
	wantHeader := []string{"mqd-base", "mqd", "JS", "default", "JS", "always", "mqd/base", "mqd/JS-default", "mqd/JS-always"}
	// row answers the fields of the line that starts with title and comes
	// after the line that starts with after.
	row := func(after, title string) []string {
		lines := strings.Split(text, "\n")
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), after) })
		if i < 0 {
			t.Fatalf("no line starting with %q", after)
		}
		for _, l := range lines[i:] {
			if l = strings.TrimSpace(l); strings.HasPrefix(l, title+" ") {
				return strings.Fields(strings.TrimPrefix(l, title))
			}
		}
		t.Fatalf("no row %q after %q", title, after)
		return nil
	}
	for _, tbl := range []struct {
		title string
		want  []string // the publish-64 row
	}{
		// 3000/2000, 3000/12000, 3000/4000
		{"msgs/s", []string{"2000", "3000", "12000", "4000", "1.50", "0.25", "0.75"}},
		// 6000/4000, 6000/24000, 6000/3000
		{"msgs per CPU-second", []string{"4000", "6000", "24000", "3000", "1.50", "0.25", "2.00"}},
	} {
		if h := row("", tbl.title); !slices.Equal(h, wantHeader) {
			t.Errorf("%s header: %q, want %q", tbl.title, h, wantHeader)
		}
		if got := row(tbl.title, "publish-64"); !slices.Equal(got, tbl.want) {
			t.Errorf("%s, publish-64: %q, want %q", tbl.title, got, tbl.want)
		}
	}
	if got := row("latency", "publish-1"); len(got) != 4*3 {
		t.Errorf("latency row: %q, want p50 / p99 of 4 systems", got)
	}
	for _, want := range []string{
		"keys, publish-16-idem / publish-16: mqd-base 1.00, mqd 0.90, js-default 1.00, js-always 1.00\n",
		"keys, publish-64-idem / publish-64: mqd-base 1.00, mqd 1.00,",
		"disk: 10000 and 14000 fsyncs/s",
		// publish-1 over the mean fsync rate: 2000, 3000, 12000, 4000 over 12000
		"publish-1 / disk fsync rate 12000/s: mqd-base 0.17, mqd 0.25, js-default 1.00, js-always 0.33\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if !strings.Contains(text, "mqd-base: /tmp/old-mqd") {
		t.Error("the report does not say which binary mqd-base is")
	}
}

// TestJSNodesAreProcesses starts a real three-node JetStream cluster with
// sync_interval: always and checks that its nodes are child processes of
// their own (so their CPU is not this process's), each with the option, and
// that stop ends them.
func TestJSNodesAreProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nats-server processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startJS(ctx, "js-always", t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	if len(c.nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(c.nodes))
	}
	for _, p := range c.nodes {
		if p.pid() == os.Getpid() {
			t.Fatalf("%s runs in this process", p.name)
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid()) + "/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || args[1] != natsNodeCmd || !slices.Contains(args, "-sync-always=true") {
			t.Errorf("%s command line %q", p.name, args)
		}
	}
	if _, ok := pidsCPU(childPids(c.nodes)); !ok {
		t.Error("the nodes' CPU time cannot be read")
	}
	// The cluster serves JetStream: a replicated stream takes a message.
	sys := &jsSystem{c: c, cfg: &config{size: 16}, always: true}
	defer sys.close()
	name, subject, leader, err := sys.stream(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	nc, js, err := c.connect(leader)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := js.Publish(ctx, subject, []byte("x")); err != nil {
		t.Fatalf("publish to %s: %v", name, err)
	}

	began := time.Now()
	c.stop()
	for _, p := range c.nodes {
		if !p.exited() {
			t.Errorf("%s still running after stop", p.name)
		}
		if st := p.cmd.ProcessState; st == nil || !st.Success() {
			t.Errorf("%s: exit %v, want a clean shutdown on SIGTERM", p.name, st)
		}
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("stop took %v: SIGTERM did not end the nodes, the SIGKILL after 10 s did", d)
	}
}

func TestRunOrder(t *testing.T) {
	all := []string{"mqd-base", "mqd", "js-default", "js-always"}
	if got := strings.Join(runOrder(all, false), ","); got != "mqd-base,mqd,js-default,js-always" {
		t.Errorf("runOrder(all, false) = %s", got)
	}
	if got := strings.Join(runOrder(all, true), ","); got != "mqd,mqd-base,js-default,js-always" {
		t.Errorf("runOrder(all, true) = %s", got)
	}
	if got := strings.Join(runOrder([]string{"mqd", "js-default"}, true), ","); got != "mqd,js-default" {
		t.Errorf("runOrder without mqd-base = %s", got)
	}
	if strings.Join(all, ",") != "mqd-base,mqd,js-default,js-always" {
		t.Errorf("runOrder changed its argument: %v", all)
	}
}
