// Command peers runs the same workloads against a three-node mqd cluster and
// a three-node JetStream cluster (three nats-server processes, R3 streams,
// file storage), once with JetStream's default sync and once with
// `sync_interval: always`, and optionally against a second, prebuilt mqd
// (-base-bin, the "mqd-base" system), back to back in one invocation, and
// prints tables of msgs/s, msgs per CPU-second, latencies and ratios of mqd
// to each of the others. See README.md.
//
//	cd bench/peers && go run .
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

type config struct {
	duration, warmup time.Duration
	size             int
	batchSize        int
	batchConc        int
	asyncWindow      int
	consumeMsgs      int
	consumers        int
	fetch            int
	mqdBin           string
	baseBin          string
	baseLast         bool
	keep             bool
}

// workload is one row of the table.
type workload struct {
	name    string
	desc    string
	latency bool // a closed loop of single publishes: p50/p99 are per publish
	run     func(ctx context.Context, s system, cfg *config) (*result, error)
}

type system interface {
	name() string
	publish(ctx context.Context, wl string, publishers int, idem bool) (*result, error)
	batch(ctx context.Context, wl string) (*result, error)
	consume(ctx context.Context, wl string, consumers int) (*result, error)
}

func publishWL(publishers int, idem bool) workload {
	name := fmt.Sprintf("publish-%d", publishers)
	desc := fmt.Sprintf("%d sync publishers", publishers)
	if idem {
		name += "-idem"
		desc += ", unique idempotency key each"
	}
	return workload{name: name, desc: desc, latency: true,
		run: func(ctx context.Context, s system, _ *config) (*result, error) {
			return s.publish(ctx, name, publishers, idem)
		}}
}

func allWorkloads() []workload {
	return []workload{
		publishWL(1, false),
		publishWL(16, false),
		publishWL(16, true),
		publishWL(64, false),
		publishWL(64, true),
		{name: "batch", desc: "mqd messages:batch vs JetStream PublishAsync",
			run: func(ctx context.Context, s system, _ *config) (*result, error) { return s.batch(ctx, "batch") }},
		{name: "consume", desc: "pre-loaded, fetch + durable ack",
			run: func(ctx context.Context, s system, cfg *config) (*result, error) {
				return s.consume(ctx, "consume", cfg.consumers)
			}},
	}
}

// systemNames are the systems in the order they run and are printed.
var systemNames = []string{"mqd-base", "mqd", "js-default", "js-always"}

// systemLabels are the systems' column headers.
var systemLabels = map[string]string{"mqd-base": "mqd-base", "mqd": "mqd", "js-default": "JS default", "js-always": "JS always"}

// ratioLabels are the headers of the columns mqd / system.
var ratioLabels = map[string]string{"mqd-base": "mqd/base", "js-default": "mqd/JS-default", "js-always": "mqd/JS-always"}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == natsNodeCmd {
		os.Exit(natsNode(os.Args[2:]))
	}
	os.Exit(run())
}

func run() int {
	cfg := &config{}
	var wlFlag, sysFlag string
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measuring time of each workload (consume: at most this long)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured warm-up before each publish/batch workload")
	flag.IntVar(&cfg.size, "size", 1024, "message payload size in bytes")
	flag.StringVar(&wlFlag, "workloads", "all", "comma-separated workloads: publish-1,publish-16,publish-16-idem,publish-64,publish-64-idem,batch,consume (or all)")
	flag.StringVar(&sysFlag, "systems", "", "comma-separated systems: mqd-base,mqd,js-default,js-always (default: mqd,js-default,js-always, with mqd-base first if -base-bin is set)")
	flag.IntVar(&cfg.batchSize, "batch-size", 100, "batch workload: messages per mqd messages:batch request")
	flag.IntVar(&cfg.batchConc, "batch-concurrency", 4, "batch workload: concurrent mqd batch requests")
	flag.IntVar(&cfg.asyncWindow, "async-window", 256, "batch workload: JetStream PublishAsyncMaxPending")
	flag.IntVar(&cfg.consumeMsgs, "consume-msgs", 50000, "consume workload: messages pre-loaded before consuming")
	flag.IntVar(&cfg.consumers, "consumers", 4, "consume workload: concurrent consumers")
	flag.IntVar(&cfg.fetch, "fetch", 100, "consume workload: max messages per fetch")
	flag.StringVar(&cfg.mqdBin, "mqd-bin", "", "use this mqd binary instead of building ./cmd/mqd of the repository")
	flag.StringVar(&cfg.baseBin, "base-bin", "", "a prebuilt mqd binary (e.g. of an older commit) to run as system mqd-base, for before/after ratios")
	flag.BoolVar(&cfg.baseLast, "base-last", false, "run mqd before mqd-base (the table keeps its order); alternate it between runs so that a drift in the machine's load favours neither")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (data and mqd logs) for inspection")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "peers: unexpected arguments:", flag.Args())
		return 2
	}
	wls, err := pickWorkloads(wlFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 2
	}
	systems, err := pickSystems(sysFlag, cfg.baseBin != "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 2
	}
	for _, bin := range []string{cfg.mqdBin, cfg.baseBin} {
		if bin == "" {
			continue
		}
		if err := checkExecutable(bin); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			return 2
		}
	}
	if cfg.size < 1 || cfg.batchSize < 1 || cfg.batchSize > 1000 || cfg.batchConc < 1 || cfg.asyncWindow < 1 ||
		cfg.consumeMsgs < 1 || cfg.consumers < 1 || cfg.fetch < 1 || cfg.fetch > 1000 || cfg.duration <= 0 || cfg.warmup < 0 {
		fmt.Fprintln(os.Stderr, "peers: a flag is out of range (sizes and counts ≥ 1, -batch-size and -fetch ≤ 1000)")
		return 2
	}

	// Ctrl-C or SIGTERM cancels ctx: the running workload stops, every
	// cluster is shut down and the temporary directory removed. A second
	// signal kills at once (the mqd children die with us: Pdeathsig).
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	go func() { <-ctx.Done(); stopSignals() }()

	tmp, err := os.MkdirTemp("", "peers-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		return 1
	}
	defer func() {
		if cfg.keep {
			logf("kept %s", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()

	began := time.Now()
	results := map[string]map[string]*result{} // system -> workload -> result
	failures := map[string]string{}
	code := 0
	// The disk's fsync rate before the first cluster and after the last:
	// publish-1's ceiling, and how much the machine's load moved meanwhile.
	var fsyncs []float64
	measureFsync := func() {
		r, err := fsyncRate(ctx, tmp, cfg.size, 2*time.Second)
		if err != nil {
			logf("%v", err)
			return
		}
		logf("disk: %.0f fsyncs/s", r)
		fsyncs = append(fsyncs, r)
	}
	measureFsync()
	for _, sys := range runOrder(systems, cfg.baseLast) {
		if ctx.Err() != nil {
			break
		}
		res, err := runSystem(ctx, sys, tmp, cfg, wls)
		results[sys] = res
		if err != nil {
			failures[sys] = err.Error()
			logf("%s: %v", sys, err)
			code = 1
		}
	}
	if ctx.Err() == nil {
		measureFsync()
	}
	interrupted := ctx.Err() != nil
	printReport(os.Stdout, cfg, wls, systems, results, failures, fsyncs, time.Since(began), interrupted)
	if interrupted {
		return 130
	}
	return code
}

func pickWorkloads(s string) ([]workload, error) {
	all := allWorkloads()
	if s == "all" || s == "" {
		return all, nil
	}
	var out []workload
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(all, func(w workload) bool { return w.name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown workload %q", n)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// pickSystems parses -systems; the result keeps the order of systemNames.
// Without -systems it is mqd, js-default and js-always, with mqd-base first
// if there is a -base-bin.
func pickSystems(s string, haveBase bool) ([]string, error) {
	if s == "" {
		s = "mqd,js-default,js-always"
		if haveBase {
			s = "mqd-base," + s
		}
	}
	want := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(systemNames, n) {
			return nil, fmt.Errorf("unknown system %q (want %s)", n, strings.Join(systemNames, ", "))
		}
		want[n] = true
	}
	if want["mqd-base"] && !haveBase {
		return nil, errors.New("system mqd-base needs -base-bin PATH")
	}
	var out []string
	for _, n := range systemNames {
		if want[n] {
			out = append(out, n)
		}
	}
	return out, nil
}

// runOrder is the order the systems run in: as listed, or with mqd before
// mqd-base when baseLast.
func runOrder(systems []string, baseLast bool) []string {
	out := slices.Clone(systems)
	b, m := slices.Index(out, "mqd-base"), slices.Index(out, "mqd")
	if baseLast && b >= 0 && m >= 0 && b < m {
		out[b], out[m] = out[m], out[b]
	}
	return out
}

// runSystem starts one system's cluster, runs every workload on it, and
// stops it again, so that at most one cluster is running at a time.
func runSystem(ctx context.Context, name, tmp string, cfg *config, wls []workload) (map[string]*result, error) {
	res := map[string]*result{}
	dir, err := os.MkdirTemp(tmp, name+"-")
	if err != nil {
		return res, err
	}
	if !cfg.keep { // after the cluster has stopped (deferred calls run last first)
		defer os.RemoveAll(dir)
	}
	var sys system
	var pids []int // the system's three server processes, for msgs per CPU-second
	switch name {
	case "mqd", "mqd-base":
		var bin string
		switch {
		case name == "mqd-base":
			bin, err = linkBinary(cfg.baseBin, dir, "peersbench-base-broker")
		case cfg.mqdBin != "":
			bin, err = linkBinary(cfg.mqdBin, dir, "peersbench-broker")
		default:
			logf("mqd: building ./cmd/mqd")
			bin, err = buildMqd(ctx, dir)
		}
		if err != nil {
			return res, err
		}
		logf("%s: starting 3 nodes", name)
		c, err := startMqd(ctx, name, bin, dir)
		if err != nil {
			return res, err
		}
		defer func() { logf("%s: stopping", name); c.stop() }()
		logf("%s: leader %s", name, c.leader)
		sys = &mqdSystem{c: c, cfg: cfg}
		pids = childPids(c.procs())
	default:
		always := name == "js-always"
		logf("%s: starting 3 nats-server %s processes", name, server.VERSION)
		c, err := startJS(ctx, name, dir, always)
		if err != nil {
			return res, err
		}
		defer func() { logf("%s: stopping", name); c.stop() }()
		s := &jsSystem{c: c, cfg: cfg, always: always}
		defer s.close()
		sys = s
		pids = childPids(c.nodes)
	}
	setBrokerCPU(func() (time.Duration, bool) { return pidsCPU(pids) })
	defer setBrokerCPU(nil)
	for _, w := range wls {
		if ctx.Err() != nil {
			return res, nil
		}
		r, err := w.run(ctx, sys, cfg)
		if err != nil {
			if ctx.Err() != nil {
				return res, nil
			}
			return res, fmt.Errorf("%s: %w", w.name, err)
		}
		if ctx.Err() != nil { // interrupted half way: not a figure
			return res, nil
		}
		res[w.name] = r
		line := fmt.Sprintf("%s %-16s %9.0f msgs/s", name+":", w.name, r.rate())
		if w.latency {
			line += fmt.Sprintf("  p50 %s  p99 %s", fmtMs(r.percentile(0.50)), fmtMs(r.percentile(0.99)))
		}
		if r.errs > 0 {
			line += fmt.Sprintf("  (%d errors; first: %s)", r.errs, r.firstErr)
		}
		logf("%s", line)
	}
	return res, nil
}

func fmtMs(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

func fmtRate(r *result) string {
	if r == nil {
		return "-"
	}
	s := fmt.Sprintf("%.0f", r.rate())
	if r.errs > 0 || r.note != "" {
		s += "*"
	}
	return s
}

func fmtRatio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func printReport(out io.Writer, cfg *config, wls []workload, systems []string, results map[string]map[string]*result,
	failures map[string]string, fsyncs []float64, took time.Duration, interrupted bool) {
	get := func(sys, wl string) *result {
		if m := results[sys]; m != nil {
			return m[wl]
		}
		return nil
	}
	fmt.Fprintf(out, "\nmqd vs JetStream %s: each system is 3 server processes on 127.0.0.1 (R3, file storage)\n", server.VERSION)
	fmt.Fprintf(out, "%s, GOMAXPROCS %d, %d-byte messages, %v per workload after %v warm-up\n",
		runtime.Version(), runtime.GOMAXPROCS(0), cfg.size, cfg.duration, cfg.warmup)
	if slices.Contains(systems, "mqd-base") {
		fmt.Fprintf(out, "mqd-base: %s\n", cfg.baseBin)
	}
	// The ratio columns: mqd against every other system that ran.
	var others []string
	if slices.Contains(systems, "mqd") {
		for _, sys := range systems {
			if sys != "mqd" {
				others = append(others, sys)
			}
		}
	}
	// table prints one row per workload: the figure of each system, then
	// mqd's figure over each other's. Both tables share one tabwriter, and
	// a row of empty cells between them, so that their columns line up.
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	table := func(title string, figure func(*result) float64, cell func(*result) string) {
		fmt.Fprintln(tw, strings.Repeat("\t", len(systems)+len(others)+1))
		hdr := []string{title}
		for _, sys := range systems {
			hdr = append(hdr, systemLabels[sys])
		}
		for _, sys := range others {
			hdr = append(hdr, ratioLabels[sys])
		}
		fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
		for _, w := range wls {
			row := []string{w.name}
			for _, sys := range systems {
				row = append(row, cell(get(sys, w.name)))
			}
			m := figure(get("mqd", w.name))
			for _, sys := range others {
				row = append(row, fmtRatio(m, figure(get(sys, w.name))))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	table("msgs/s", (*result).rate, fmtRate)
	// CPU: user + system time of each system's three server processes over
	// the measuring window; the load generator's is not counted.
	table("msgs per CPU-second", (*result).perCPU, func(r *result) string {
		if r.perCPU() == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", r.perCPU())
	})
	tw.Flush()
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		fmt.Fprintln(out, strings.TrimRight(line, " "))
	}

	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, w := range slices.DeleteFunc(slices.Clone(wls), func(w workload) bool { return !w.latency }) {
		if i == 0 {
			hdr := []string{"latency p50 / p99"}
			for _, sys := range systems {
				hdr = append(hdr, systemLabels[sys])
			}
			fmt.Fprintln(out)
			fmt.Fprintln(tw, strings.Join(hdr, "\t")+"\t")
		}
		row := []string{w.name}
		for _, sys := range systems {
			r := get(sys, w.name)
			if r == nil {
				row = append(row, "-")
				continue
			}
			row = append(row, fmtMs(r.percentile(0.50))+" / "+fmtMs(r.percentile(0.99)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	// Scaling: throughput at 64 publishers over throughput at 1.
	var scal []string
	for _, sys := range systems {
		one, many := get(sys, "publish-1"), get(sys, "publish-64")
		if one != nil && many != nil && one.rate() > 0 {
			scal = append(scal, fmt.Sprintf("%s %.1fx", sys, many.rate()/one.rate()))
		}
	}
	if len(scal) > 0 {
		fmt.Fprintf(out, "\nscaling, publish-64 / publish-1: %s\n", strings.Join(scal, ", "))
	}
	// What a unique idempotency key costs: keyed over plain throughput at
	// the same concurrency.
	for _, c := range []int{16, 64} {
		var keyed []string
		for _, sys := range systems {
			plain, idem := get(sys, fmt.Sprintf("publish-%d", c)), get(sys, fmt.Sprintf("publish-%d-idem", c))
			if plain != nil && idem != nil && plain.rate() > 0 {
				keyed = append(keyed, fmt.Sprintf("%s %.2f", sys, idem.rate()/plain.rate()))
			}
		}
		if len(keyed) > 0 {
			fmt.Fprintf(out, "keys, publish-%d-idem / publish-%d: %s\n", c, c, strings.Join(keyed, ", "))
		}
	}
	// publish-1 against the disk: one fsync per message is a serial
	// publisher's ceiling (fsync.go).
	if len(fsyncs) > 0 {
		var sum float64
		var each []string
		for _, r := range fsyncs {
			sum += r
			each = append(each, fmt.Sprintf("%.0f", r))
		}
		disk := sum / float64(len(fsyncs))
		var of []string
		for _, sys := range systems {
			if one := get(sys, "publish-1"); one != nil && one.rate() > 0 {
				of = append(of, fmt.Sprintf("%s %.2f", sys, one.rate()/disk))
			}
		}
		fmt.Fprintf(out, "disk: %s fsyncs/s (%d-byte appends, one writer; before the first cluster, after the last)\n",
			strings.Join(each, " and "), cfg.size)
		if len(of) > 0 {
			fmt.Fprintf(out, "publish-1 / disk fsync rate %.0f/s: %s\n", disk, strings.Join(of, ", "))
		}
	}

	var notes []string
	for _, sys := range systems {
		for _, w := range wls {
			r := get(sys, w.name)
			if r == nil {
				continue
			}
			if r.errs > 0 {
				notes = append(notes, fmt.Sprintf("* %s %s: %d failed operations; first: %s", sys, w.name, r.errs, r.firstErr))
			}
			if r.note != "" {
				notes = append(notes, fmt.Sprintf("* %s %s: %s", sys, w.name, r.note))
			}
		}
		if f, ok := failures[sys]; ok {
			notes = append(notes, fmt.Sprintf("! %s: %s", sys, f))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(out, "\n%s\n", strings.Join(notes, "\n"))
	}
	status := ""
	if interrupted {
		status = " (interrupted: partial results)"
	}
	fmt.Fprintf(out, "\nbatch: mqd %d concurrent messages:batch requests of %d; JetStream PublishAsync, %d outstanding. consume: %d pre-loaded, %d consumers, fetch %d; mqd acks each fetch in one request, JetStream AckSync per message.\ntotal %v%s\n",
		cfg.batchConc, cfg.batchSize, cfg.asyncWindow, cfg.consumeMsgs, cfg.consumers, cfg.fetch, took.Round(time.Second), status)
}
