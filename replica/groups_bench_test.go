package replica

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Issue 22: what an idle raft group costs a process. The figures are in
// docs/performance.md (Idle cost per raft group).
var (
	idleWindow  = flag.Duration("idlewindow", 10*time.Second, "BenchmarkIdleGroups: the idle window measured")
	idleProfile = flag.String("idleprofile", "", "BenchmarkIdleGroups: write a CPU profile of the idle window (not of the set-up) and a heap profile at its start to files named by this prefix and the sub-benchmark")
)

// rpcCounts are the AppendEntries a group's replicas send.
type rpcCounts struct {
	beats   atomic.Int64 // heartbeats: AppendEntries without entries, outside the pipeline
	appends atomic.Int64 // through the pipeline (replication; idle: the commit index every CommitTimeout)
}

// countingTransport counts the AppendEntries a replica sends: hashicorp/raft
// sends heartbeats on their own, every HeartbeatTimeout/10 to 2× that,
// and everything else through the pipeline.
type countingTransport struct {
	*raft.NetworkTransport
	n *rpcCounts
}

func (c countingTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if len(args.Entries) == 0 {
		c.n.beats.Add(1)
	}
	return c.NetworkTransport.AppendEntries(id, target, args, resp)
}

func (c countingTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := c.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	return countingPipeline{p, c.n}, nil
}

type countingPipeline struct {
	raft.AppendPipeline
	n *rpcCounts
}

func (p countingPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.n.appends.Add(1)
	return p.AppendPipeline.AppendEntries(args, resp)
}

// idleSample is what the process holds and has spent at one moment.
type idleSample struct {
	cpu        time.Duration // user + system, the whole process
	goroutines int
	fds        int
	heap       uint64 // bytes in live objects, after a GC
	at         time.Time
}

func sampleIdle(b *testing.B) idleSample {
	b.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		b.Fatal(err)
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return idleSample{cpu: cpu, goroutines: runtime.NumGoroutine(), fds: len(fds), heap: ms.HeapAlloc, at: time.Now()}
}

// openIdleGroups opens k groups of three replicas (one per data dir, each
// on its own TCP transport, node defaults for snapshots and the log) and
// runs them; stop ends and shuts down every replica.
func openIdleGroups(b *testing.B, ctx context.Context, k int, dataDirs []string, n *rpcCounts) (reps []*Group, stop func()) {
	b.Helper()
	logger := slog.New(slog.DiscardHandler)
	var stops []func()
	// stop stops the groups side by side, each group's replicas one after
	// the other (as nodes stopping in turn: the leader hands off first).
	stop = func() {
		var wg sync.WaitGroup
		for from := 0; from < len(stops); from += len(dataDirs) {
			group := stops[from:min(from+len(dataDirs), len(stops))]
			wg.Go(func() {
				for _, s := range group {
					s()
				}
			})
		}
		wg.Wait()
	}
	for gi := range k {
		id := fmt.Sprintf("g%03d", gi)
		var servers []raft.Server
		var trans []GatedTransport
		for i := range dataDirs {
			tr, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 3, 10*time.Second, NewHclog(logger, "raft"))
			if err != nil {
				stop()
				b.Fatal(err)
			}
			trans = append(trans, countingTransport{tr, n})
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprintf("n%d", i+1)), Address: tr.LocalAddr()})
		}
		for i, dataDir := range dataDirs {
			dir, err := GroupDir(dataDir, id)
			if err != nil {
				stop()
				b.Fatal(err)
			}
			g, err := OpenGroup(GroupConfig{ID: id, NodeID: string(servers[i].ID), Dir: dir, Transport: trans[i],
				LogStore: LogStoreWAL, WALSegment: 64 << 20, SnapshotThreshold: 8192, SnapshotInterval: 30 * time.Second,
				TrailingLogs: 10240, Logger: logger})
			if err != nil {
				stop()
				b.Fatalf("open %s on n%d: %v", id, i+1, err)
			}
			if err := g.Bootstrap(servers); err != nil {
				stop()
				b.Fatalf("bootstrap %s: %v", id, err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); g.Run(rctx) }()
			reps = append(reps, g)
			stops = append(stops, func() {
				cancel()
				<-done
				if err := g.Shutdown(); err != nil {
					b.Errorf("shutdown %s: %v", g.ID(), err)
				}
			})
		}
	}
	return reps, stop
}

// diskUse counts the files and directories under each group's directory
// and the bytes they take on disk (allocated blocks, not apparent size).
func diskUse(b *testing.B, reps []*Group) (files int, bytes int64) {
	b.Helper()
	for _, g := range reps {
		err := filepath.WalkDir(g.Dir(), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			files++
			info, err := d.Info()
			if err != nil {
				return err
			}
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				bytes += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return files, bytes
}

// BenchmarkIdleGroups opens K idle groups of three replicas each in one
// process (three "nodes": three data dirs), waits until every group has a
// serving leader and a little more, then measures the process over an idle
// window against the same window measured before the groups were opened.
// Per group means all three replicas of it; a node hosts one of them.
//
//	go test -run XXX -bench IdleGroups -benchtime 1x ./replica/ [-idlewindow 10s] [-idleprofile cpu.out]
func BenchmarkIdleGroups(b *testing.B) {
	for _, k := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			for range b.N {
				idleGroups(b, k)
			}
		})
	}
	// The same, with the idle leader's commit-index AppendEntries 10× rarer.
	b.Run("K=16,commit=500ms", func(b *testing.B) {
		defer func(d time.Duration) { raftCommitTimeout = d }(raftCommitTimeout)
		raftCommitTimeout = 500 * time.Millisecond
		for range b.N {
			idleGroups(b, 16)
		}
	})
}

func idleGroups(b *testing.B, k int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dataDirs := []string{b.TempDir(), b.TempDir(), b.TempDir()}

	// K=0: the same process, the same window, nothing open.
	base := sampleIdle(b)
	if Pause(ctx, *idleWindow) != nil {
		b.Fatal(ctx.Err())
	}
	baseEnd := sampleIdle(b)

	var n rpcCounts
	reps, stop := openIdleGroups(b, ctx, k, dataDirs, &n)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	waitServing(b, ctx, reps, len(dataDirs))
	// Let the term's first work (barrier, checkpoints, wheel rebuild) end.
	if Pause(ctx, 2*time.Second) != nil {
		b.Fatal(ctx.Err())
	}

	b.ResetTimer()
	held := sampleIdle(b) // before the profile's file and goroutine
	stopProfile := startIdleProfile(b)
	start, beats0, appends0 := sampleIdle(b), n.beats.Load(), n.appends.Load()
	if Pause(ctx, *idleWindow) != nil {
		b.Fatal(ctx.Err())
	}
	end, beats1, appends1 := sampleIdle(b), n.beats.Load(), n.appends.Load()
	stopProfile()
	b.StopTimer()

	files, bytes := diskUse(b, reps)
	reportIdle(b, k, base, baseEnd, held, start, end, beats1-beats0, appends1-appends0, files, bytes)

	stopped = true
	stopWithin(b, stop, 2*time.Minute)
	// Every goroutine the groups started ends with them.
	leak := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > base.goroutines+2 {
		if time.Now().After(leak) {
			b.Errorf("goroutines: %d after shutdown, %d before the groups opened", runtime.NumGoroutine(), base.goroutines)
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			break
		}
		if Pause(ctx, 20*time.Millisecond) != nil {
			break
		}
	}
}

// waitServing waits (up to 2 min) until each group of reps (per
// replicas in a row) has a serving leader.
func waitServing(b *testing.B, ctx context.Context, reps []*Group, per int) {
	b.Helper()
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for from := 0; from < len(reps); from += per {
		for !slices.ContainsFunc(reps[from:from+per], (*Group).Serving) {
			if Pause(wait, 20*time.Millisecond) != nil {
				b.Fatalf("group %s: no serving leader: %v", reps[from].ID(), wait.Err())
			}
		}
	}
}

// startIdleProfile writes a heap profile and starts the CPU profile when
// -idleprofile is set; what it returns stops the CPU profile.
func startIdleProfile(b *testing.B) (stop func()) {
	b.Helper()
	if *idleProfile == "" {
		return func() {}
	}
	name := strings.NewReplacer("/", ".", "=", "", ",", ".").Replace(b.Name())
	if err := writeHeapProfile(*idleProfile + ".heap." + name); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(*idleProfile + "." + name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// reportIdle reports the window from start to end per group: CPU less the
// baseline's rate, RPCs, and what the groups hold (held against base).
func reportIdle(b *testing.B, k int, base, baseEnd, held, start, end idleSample, beats, appends int64, files int, bytes int64) {
	b.Helper()
	baseRate := (baseEnd.cpu - base.cpu).Seconds() / baseEnd.at.Sub(base.at).Seconds()
	wall := end.at.Sub(start.at).Seconds()
	kf := float64(k)
	cpu := 1000 * ((end.cpu - start.cpu).Seconds() - baseRate*wall) / wall / kf
	b.ReportMetric(cpu, "cpu_ms_per_group_s")
	b.ReportMetric(float64(beats)/wall/kf, "heartbeats/group_s")
	b.ReportMetric(float64(appends)/wall/kf, "appends/group_s")
	b.ReportMetric(float64(held.goroutines-base.goroutines)/kf, "goroutines/group")
	b.ReportMetric(float64(held.fds-base.fds)/kf, "fds/group")
	b.ReportMetric(float64(files)/kf, "files/group")
	b.ReportMetric(float64(bytes)/1024/kf, "disk_KiB/group")
	b.ReportMetric((float64(held.heap)-float64(base.heap))/1024/kf, "heap_KiB/group")
	b.ReportMetric(1000*baseRate, "base_cpu_ms_s")
	// Logged too: a failed benchmark prints no metrics, and the shutdown
	// after this may fail it.
	b.Logf("K=%d: %.2f cpu_ms_per_group_s, %.2f heartbeats/group_s, %.2f appends/group_s, %.2f goroutines/group, %.2f fds/group",
		k, cpu, float64(beats)/wall/kf, float64(appends)/wall/kf,
		float64(held.goroutines-base.goroutines)/kf, float64(held.fds-base.fds)/kf)
}

// writeHeapProfile writes what the heap holds now (after the GC of
// sampleIdle) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stopWithin runs stop, failing the benchmark if it has not returned
// within d; the goroutines then are written to a file it names.
func stopWithin(b *testing.B, stop func(), d time.Duration) {
	b.Helper()
	done := make(chan struct{})
	go func() { defer close(done); stop() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		path := filepath.Join(os.TempDir(), "idlegroups-shutdown.goroutines")
		if f, err := os.Create(path); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 2)
			f.Close()
		}
		b.Fatalf("the groups' shutdown has not ended after %v (goroutines: %s)", d, path)
	}
}
