package chaos

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqd/mqd/internal/powerfs"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// Config is one run of the harness.
type Config struct {
	Seed              int64
	Duration          time.Duration // nemesis phase (the workload runs through it)
	MaxFaults         int
	Producers         int
	Partitions        int
	Groups            []string
	ConsumersPerGroup int
	PoisonRate        float64
	ProducerPause     time.Duration // mean pause between a producer's keys
	DrainTimeout      time.Duration
	Keep              string   // if set, a failed run copies node logs, data and figures here
	Kinds             []string // fault kinds to draw from (nil: every kind but the power cuts)
	SnapshotThreshold int      // --snapshot-threshold of the nodes
	TrailingLogs      int      // --trailing-logs (0: half the threshold)
	NoReplay          bool     // no DLQ replays in the workload
	NoTorn            bool     // power cuts never tear a write (otherwise one in two does)
	FileSyncEntries   bool     // a file fsync also makes earlier directory entries durable (ext4-like)
	RaftLog           string   // --raft-log of the nodes ("": the default, wal)
	Soak              bool     // a TestSoak run (for the reproduce line)
	TLS               bool     // nodes with certificates: HTTPS, mutual TLS for raft and node-to-node HTTP
	Process           bool     // also run the processing workload (process.go): stages consuming chaos-in into chaos-out
	ProcessSplit      bool     // its stages publish, then ack (two calls): the broken stage the checker must catch
	StageBinary       string   // the stage program ("": built from ./test/chaos/stage)
	Light             bool     // a lighter main workload: one producer, one group, one consumer (see lighten)
	DataGroups        bool     // five nodes with --data-groups, the workload over dataTopics (datagroups.go)
}

// dataShape gives cfg the data-groups mode's shape: the workload runs per
// topic (dataTopics), each with 2 producers and groups g1, g2 of 2
// consumers, so that three topics load five nodes about as the default
// workload loads three.
func dataShape(cfg *Config) {
	cfg.DataGroups, cfg.Producers, cfg.Groups, cfg.ConsumersPerGroup = true, 2, []string{"g1", "g2"}, 2
}

// lighten makes cfg's main workload light (one producer, one group with
// one consumer), for runs whose subject is the processing workload.
func lighten(cfg *Config) {
	cfg.Light, cfg.Producers, cfg.Groups, cfg.ConsumersPerGroup = true, 1, []string{"g1"}, 1
}

// DataGroupsConfig is the CI shape of a run in the data-groups mode: five
// nodes with --data-groups, the workload over three topics placed in three
// data groups led by three nodes, and the faults aimed at them.
func DataGroupsConfig(seed int64, d time.Duration) Config {
	cfg := DefaultConfig(seed, d)
	dataShape(&cfg)
	return cfg
}

// DefaultConfig is the CI shape of a run with the given seed and length.
func DefaultConfig(seed int64, d time.Duration) Config {
	return Config{Seed: seed, Duration: d, MaxFaults: 1 << 20, Producers: 4, Partitions: 3,
		Groups: []string{"g1", "g2", "g3"}, ConsumersPerGroup: 2, PoisonRate: 0.03,
		ProducerPause: 15 * time.Millisecond, DrainTimeout: 120 * time.Second, SnapshotThreshold: 2048}
}

const topic = "chaos"

// drainStall is how long a drain may see no change at all before it gives up.
const drainStall = 30 * time.Second

// Run starts a 3-node cluster behind Raft proxies, runs the workload under
// the nemesis for cfg.Duration, heals and drains, checks the history and
// returns the figures. Violations fail t.
func Run(t *testing.T, cfg Config) *Figures {
	extra := ""
	if len(cfg.Kinds) > 0 {
		extra += " -chaos.kinds " + strings.Join(cfg.Kinds, ",")
	}
	if cfg.NoReplay {
		extra += " -chaos.no-replay"
	}
	if cfg.NoTorn {
		extra += " -chaos.no-torn"
	}
	if cfg.FileSyncEntries {
		extra += " -chaos.file-sync-entries"
	}
	if cfg.SnapshotThreshold != DefaultConfig(0, 0).SnapshotThreshold {
		extra += fmt.Sprintf(" -chaos.snapshot-threshold %d", cfg.SnapshotThreshold)
	}
	if cfg.TrailingLogs != 0 {
		extra += fmt.Sprintf(" -chaos.trailing-logs %d", cfg.TrailingLogs)
	}
	if cfg.TLS {
		extra += " -chaos.tls on"
	} else {
		extra += " -chaos.tls off"
	}
	if cfg.RaftLog != "" {
		extra += " -chaos.raft-log " + cfg.RaftLog
	}
	if cfg.Process {
		extra += " -chaos.process"
	}
	if cfg.ProcessSplit {
		extra += " -chaos.stage-split"
	}
	if cfg.Light {
		extra += " -chaos.light"
	}
	if cfg.DataGroups {
		extra += " -chaos.data-groups"
	}
	repro := fmt.Sprintf("go test ./test/chaos/ -run 'TestChaos$' -chaos.runs 1 -chaos.seed %d -chaos.duration %v%s -v", cfg.Seed, cfg.Duration, extra)
	if cfg.Soak {
		repro = fmt.Sprintf("go test ./test/chaos/ -run TestSoak -soak %v -chaos.seed %d%s -timeout %v -v", cfg.Duration, cfg.Seed, extra, cfg.Duration+20*time.Minute)
	}
	t.Logf("chaos run: seed %d, %v of faults, TLS %v (reproduce: %s)", cfg.Seed, cfg.Duration, cfg.TLS, repro)
	nodeCount, topics := 3, []string{topic}
	if cfg.DataGroups {
		nodeCount, topics = dataNodes, dataTopics
		if len(cfg.Kinds) == 0 {
			cfg.Kinds = dataKinds
		}
	}
	cfg.Kinds = usablePowerKinds(t, cfg.Kinds)
	power := &powerMounts{fs: map[string]*powerfs.FS{}}
	withPower := slices.ContainsFunc(cfg.Kinds, isPower)
	began := time.Now()

	// Proxies first, so that their cleanup runs after the nodes are killed.
	var (
		nodesMu sync.Mutex
		nodes   = map[string]*tc.Node{}
	)
	nw := NewNet(func() []int {
		nodesMu.Lock()
		defer nodesMu.Unlock()
		var pids []int
		for _, n := range nodes {
			if pid := n.PID(); pid > 0 {
				pids = append(pids, pid)
			}
		}
		return pids
	}, func(pid int) string {
		nodesMu.Lock()
		defer nodesMu.Unlock()
		for id, n := range nodes {
			if n.PID() == pid {
				return id
			}
		}
		return ""
	})
	t.Cleanup(nw.Close)
	proxies := map[string]*Proxy{}
	for i := 1; i <= nodeCount; i++ {
		id := fmt.Sprintf("n%d", i)
		p, err := nw.NewProxy(id)
		if err != nil {
			t.Fatal(err)
		}
		proxies[id] = p
	}
	client := tc.NewClient(reqTimeout, 64)
	admin := client // node-to-node routes (GET /v1/internal/status)
	var tlsOpt []tc.Option
	caPath := ""
	if cfg.TLS {
		// The proxies pass raft's TLS through untouched: they advertise
		// 127.0.0.1, which the test certificates name.
		ca := tc.NewCA(t, "chaos-ca")
		client = tc.NewTLSClient(reqTimeout, 64, ca.Pool(), nil)
		cert := ca.KeyPair("chaos-admin")
		admin = tc.NewTLSClient(reqTimeout, 8, ca.Pool(), &cert)
		tlsOpt = append(tlsOpt, tc.WithTLS(ca))
		caPath = ca.CertPath()
	}
	if cfg.DataGroups {
		tlsOpt = append(tlsOpt, tc.WithFlags("--data-groups"))
	}
	c := tc.Start(t, nodeCount, append(tlsOpt,
		tc.WithClient(client),
		tc.WithReadyTimeout(60*time.Second),
		tc.WithLogTail(120),
		tc.WithSnapshot(cfg.SnapshotThreshold, 3*time.Second, cmp.Or(cfg.TrailingLogs, cfg.SnapshotThreshold/2)),
		tc.WithNodeArgs(func(n *tc.Node) []string {
			p := proxies[n.ID()]
			p.SetTarget(n.RaftAddr())
			nodesMu.Lock()
			nodes[n.ID()] = n
			nodesMu.Unlock()
			if withPower {
				power.mount(t, n, cfg.Seed, cfg.FileSyncEntries)
			}
			args := []string{"--raft-advertise-addr", p.Addr()}
			if cfg.RaftLog != "" {
				args = append(args, "--raft-log", cfg.RaftLog)
			}
			return args
		}))...)
	if cfg.Keep != "" {
		t.Cleanup(func() {
			if t.Failed() {
				keepLogs(t, cfg, c)
			}
		})
	}

	// Topic and groups (the groups exist before any message, so that
	// retention keeps every message for each of them).
	setup, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leader, err := c.Leader(setup)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range topics {
		if _, err := leader.PutTopic(setup, tp, map[string]any{
			"partitions": cfg.Partitions, "max_retry": 3, "backoff_base_ms": 50, "backoff_max_ms": 1000,
			"backoff_jitter_ms": 50, "ack_timeout_ms": 2000}); err != nil {
			t.Fatalf("create topic %s: %v", tp, err)
		}
		for _, g := range cfg.Groups {
			r, err := leader.Do(setup, http.MethodPut, groupPath(tp, g), nil, nil)
			if err == nil {
				err = r.Expect(http.StatusCreated, http.StatusOK)
			}
			if err != nil {
				t.Fatalf("create group %s of %s: %v", g, tp, err)
			}
		}
	}
	if cfg.DataGroups {
		// Placement must have spread the topics before any fault.
		spread, err := waitSpread(setup, c, topics)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range topics {
			t.Logf("topic %s: data group %s, leader %s", tp, spread[tp][0], spread[tp][1])
		}
	}

	var pw *procWorkload
	if cfg.Process {
		if err := setupProcess(setup, leader); err != nil {
			t.Fatal(err)
		}
		pw = newProcWorkload(t, cfg, c.Nodes(), caPath)
		if cfg.DataGroups {
			gin, _, err1 := topicPlacement(setup, leader, procIn)
			gout, _, err2 := topicPlacement(setup, leader, procOut)
			if err := cmp.Or(err1, err2); err != nil {
				t.Fatalf("placement of %s, %s: %v", procIn, procOut, err)
			}
			pw.across = gin != gout
			t.Logf("processing: %s in data group %s, %s in %s", procIn, gin, procOut, gout)
		}
	}
	hs := make([]*History, len(topics))
	ws := make([]*workload, len(topics))
	for i, tp := range topics {
		hs[i] = newHistory(cfg.Groups)
		ws[i] = newWorkload(cfg, tp, c.Nodes(), hs[i])
		if cfg.DataGroups {
			ws[i].salt, ws[i].seqPrefix = uint64(i+1)<<20, fmt.Sprintf("s%d-%s", cfg.Seed, tp)
		}
	}
	for _, w := range ws {
		w.start()
	}
	if pw != nil {
		pw.start()
		t.Cleanup(pw.halt)
	}
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		for _, w := range ws {
			w.stopNew.Store(true)
			w.finishBy.Store(time.Now().UnixNano())
			w.stopRepl.Store(true)
			w.stopCons.Store(true)
		}
		for _, w := range ws {
			w.prodWG.Wait()
			w.replWG.Wait()
			w.consWG.Wait()
		}
	}
	t.Cleanup(stopAll) // on every way out (t.Fatal from a node control included)

	// Faults.
	nm := newNemesis(t, c, nw, cfg.Seed, cfg.Kinds, power)
	nm.noTorn = cfg.NoTorn
	nm.groups, nm.admin = cfg.DataGroups, admin
	if err := nm.Run(time.Now().Add(cfg.Duration), cfg.MaxFaults); err != nil {
		t.Errorf("nemesis: %v", err)
	}

	// Heal, let the producers finish their current keys, drain.
	for _, w := range ws {
		w.stopNew.Store(true)
	}
	if pw != nil {
		pw.endFaults()
	}
	nm.HealAll()
	if err := nm.waitReady(90*time.Second, "final heal"); err != nil {
		t.Errorf("%v", err)
	}
	if cfg.DataGroups {
		if err := waitMoves(context.Background(), c, admin, 90*time.Second); err != nil {
			t.Errorf("final heal: %v", err)
		}
	}
	for _, w := range ws {
		w.finishBy.Store(time.Now().Add(60 * time.Second).UnixNano())
	}
	for _, w := range ws {
		w.prodWG.Wait()
		w.stopRepl.Store(true)
	}
	for _, w := range ws {
		w.replWG.Wait()
		w.polite.Store(true)
	}
	nm.logf("producers done; draining")
	fins := make([]Final, len(topics))
	for i, tp := range topics {
		fin, err := drain(c, cfg, tp)
		if err != nil {
			t.Errorf("drain %s: %v", tp, err)
		}
		fins[i] = fin
	}
	stopAll()
	// Read the final state once more with every client stopped.
	for i, tp := range topics {
		if f2, err := finalState(c, cfg, tp); err != nil {
			t.Errorf("final state of %s: %v", tp, err)
		} else {
			fins[i] = f2
		}
	}

	figs := Check(hs[0], fins[0], cfg.Groups)
	if cfg.DataGroups {
		figs = &Figures{Ops: map[string]int{}, Violations: map[string][]string{}, Anomalies: map[string]int{}}
		for i, tp := range topics {
			figs.add(tp, Check(hs[i], fins[i], cfg.Groups))
		}
	}
	if pw != nil {
		pw.stopFaults()
		nm.logf("processing: stage faults over; draining %s", procIn)
		if err := pw.drain(c, cfg.DrainTimeout); err != nil {
			t.Errorf("processing drain: %v", err)
		}
		pw.check(c, figs)
	}
	// Replicas must hold the same state at the same applied index.
	if cfg.DataGroups {
		// Per group; a comparison that cannot be made fails the run.
		compared, diffs, err := compareGroups(c, t.TempDir())
		figs.GroupsCompared = compared
		switch {
		case err != nil:
			figs.Violations["replica-comparison"] = []string{err.Error()}
		case len(diffs) > 0:
			figs.Violations["replica-divergence"] = diffs
		default:
			figs.ReplicasCompared = true
		}
	} else if diffs, err := compareReplicas(c, t.TempDir()); err != nil {
		t.Logf("replica comparison skipped: %v", err)
		figs.Anomalies["replica comparison skipped"]++
	} else if len(diffs) > 0 {
		figs.Violations["replica-divergence"] = diffs
	} else {
		figs.ReplicasCompared = true
	}
	figs.Seed = cfg.Seed
	figs.Elapsed = time.Since(began)
	figs.Faults = nm.Counts
	for k, v := range nm.Notes {
		figs.Anomalies[k] += v
	}
	t.Logf("chaos figures:\n%s%s", figs, nw.Stats())
	for kind, v := range figs.Violations {
		t.Errorf("VIOLATION %s: %d, first: %s", kind, len(v), v[0])
	}
	if cfg.Keep != "" && t.Failed() {
		os.MkdirAll(cfg.Keep, 0o755)
		var events []string
		for _, h := range hs {
			events = append(events, h.events...)
		}
		os.WriteFile(filepath.Join(cfg.Keep, fmt.Sprintf("seed-%d-figures.txt", cfg.Seed)),
			[]byte(figs.String()+"\nclient events (UTC):\n"+strings.Join(events, "\n")+"\n"), 0o644)
	}
	return figs
}

// finalState reads topic's stats and every group's DLQ, retrying
// transient errors for a bounded time.
func finalState(c *tc.Cluster, cfg Config, topic string) (Final, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		for _, n := range c.Live() {
			fin, err := finalVia(ctx, n, cfg, topic)
			if err == nil {
				return fin, nil
			}
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return Final{}, fmt.Errorf("%v (last error: %v)", ctx.Err(), last)
}

func finalVia(ctx context.Context, n *tc.Node, cfg Config, topic string) (Final, error) {
	fin := Final{DLQ: map[string][]deadLetter{}}
	rctx, cancel := context.WithTimeout(ctx, reqTimeout)
	s, err := n.Stats(rctx, topic)
	cancel()
	if err != nil {
		return fin, err
	}
	fin.Stats = s
	for _, g := range cfg.Groups {
		d, err := readDLQ(ctx, n, topic, g)
		if err != nil {
			return fin, err
		}
		fin.DLQ[g] = d
	}
	return fin, nil
}

// drain lets the (now polite) consumers run until every group of topic has
// nothing left: backlog, in_flight, delayed and replay_pending all 0,
// twice in a row.
func drain(c *tc.Cluster, cfg Config, topic string) (Final, error) {
	deadline := time.Now().Add(cfg.DrainTimeout)
	var last Final
	var lastErr error
	zeroes := 0
	// A drain that makes no progress at all for a while is stuck; say so
	// rather than wait out the whole bound.
	lastChange, lastSig := time.Now(), ""
	for time.Now().Before(deadline) {
		if time.Since(lastChange) > drainStall {
			return last, fmt.Errorf("drain stalled: no change in %v: %+v", drainStall, last.Stats.Groups)
		}
		time.Sleep(500 * time.Millisecond)
		fin, err := finalState(c, cfg, topic)
		if err != nil {
			lastErr = err
			continue
		}
		last = fin
		if sig := fmt.Sprint(fin.Stats.Groups); sig != lastSig {
			lastSig, lastChange = sig, time.Now()
		}
		empty := true
		for _, g := range cfg.Groups {
			gs, ok := fin.Stats.Groups[g]
			if !ok || gs.Backlog+gs.InFlight+gs.Delayed+gs.ReplayPending != 0 {
				empty = false
			}
		}
		if !empty {
			zeroes = 0
			continue
		}
		if zeroes++; zeroes >= 2 {
			return fin, nil
		}
	}
	return last, fmt.Errorf("groups not drained within %v (last error %v): %+v", cfg.DrainTimeout, lastErr, last.Stats.Groups)
}

// keepLogs copies every node's log and data directory (after killing the
// nodes, so the files are still) into cfg.Keep/seed-N.
func keepLogs(t *testing.T, cfg Config, c *tc.Cluster) {
	dir := filepath.Join(cfg.Keep, fmt.Sprintf("seed-%d", cfg.Seed))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep: %v", err)
		return
	}
	c.KillAll()
	for _, n := range c.Nodes() {
		if err := os.CopyFS(filepath.Join(dir, n.ID()+"-data"), os.DirFS(n.DataDir())); err != nil {
			t.Logf("keep %s data: %v", n.ID(), err)
		}
	}
	for _, n := range c.Nodes() {
		src, err := os.Open(n.LogPath())
		if err != nil {
			continue
		}
		dst, err := os.Create(filepath.Join(dir, n.ID()+".log"))
		if err == nil {
			io.Copy(dst, src)
			dst.Close()
		}
		src.Close()
	}
	t.Logf("node logs kept in %s", dir)
}
