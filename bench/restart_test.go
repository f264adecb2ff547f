package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var (
	flagRestartMB = flag.String("restart.mb", "100",
		"Restart: comma-separated retained payload sizes in MiB, one sub-benchmark each (e.g. 100,1024)")
	flagRestartLog = flag.String("restart.log", "policy,all",
		"Restart: comma-separated cases of the raft log held at the restart (policy, all)")
	flagRestartBin = flag.String("restart.bin", "",
		"Restart: comma-separated NAME=PATH mqd binaries, one sub-benchmark each, side by side (default: this repository's)")
	flagRestartLogs = flag.String("restart.logs", "",
		"Restart: a directory to copy each restarted node's log into (what it wrote from its restart until ready)")
)

// BenchmarkRestart measures what an operator sees after kill -9 of a node
// holding a retained backlog: the time from the restart of the process
// until its /readyz answers 200, for a follower and then for the leader,
// against the retained payload (1 KiB messages published in batches of
// 1000, no consumer group, so everything is kept). It also reports fsm.db's
// size and the data directory's disk use (fsm.db, raft log, snapshots)
// per payload byte.
//
// Two cases per size. log=policy: the nodes run their default snapshot
// policy, so how much raft log a restart reads back depends on when the
// last snapshot fell (up to half the state's size). log=all: no snapshot
// is taken (--snapshot-interval 24h), so the restart reads back the raft
// log of the whole backlog — the worst case, twice what the policy allows.
//
// -restart.log picks the cases; -restart.bin runs several binaries side by
// side (e.g. before=/tmp/mqd-old,after=/tmp/mqd-new), each on a cluster of
// its own; -restart.logs keeps what each restarted node logged until ready
// (the node logs how long opening fsm.db took, and raft its own start).
//
//	go test -run '^$' -bench Restart -benchtime 1x ./bench/ -restart.mb 100,1024
func BenchmarkRestart(b *testing.B) {
	cases := map[string][]string{"policy": nil, "all": {"--snapshot-interval", "24h"}}
	bins := restartBinaries(b)
	for _, f := range strings.Split(*flagRestartMB, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || mb <= 0 {
			b.Fatalf("-restart.mb: %q is not a positive number of MiB", f)
		}
		for _, name := range strings.Split(*flagRestartLog, ",") {
			flags, ok := cases[name]
			if !ok {
				b.Fatalf("-restart.log: %q is neither policy nor all", name)
			}
			for _, bin := range bins {
				sub := fmt.Sprintf("retained=%dMiB/log=%s", mb, name)
				if bin.name != "" {
					sub += "/bin=" + bin.name
				}
				b.Run(sub, func(b *testing.B) {
					fixed(b, func(b *testing.B) []metric { return restartAfterBacklog(b, mb, bin.path, flags) })
				})
			}
		}
	}
}

type restartBinary struct{ name, path string }

// restartBinaries parses -restart.bin; without it, one unnamed entry for
// the repository's binary.
func restartBinaries(b *testing.B) []restartBinary {
	if *flagRestartBin == "" {
		return []restartBinary{{}}
	}
	var out []restartBinary
	for _, f := range strings.Split(*flagRestartBin, ",") {
		name, path, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || name == "" || path == "" {
			b.Fatalf("-restart.bin: %q is not NAME=PATH", f)
		}
		out = append(out, restartBinary{name, path})
	}
	return out
}

func restartAfterBacklog(b *testing.B, mb int, binary string, flags []string) []metric {
	var opts []tc.Option
	if binary != "" {
		opts = append(opts, tc.WithBinary(binary))
	}
	s := startSystemWith(b, 3, opts, flags...)
	topic := s.topic(b, "restart", map[string]any{"partitions": 4})
	n := mb << 20 / payloadSize
	start := time.Now()
	s.backlog(b, topic, n, payloadSize)
	b.Logf("published %d MiB (%d messages) in %v", mb, n, time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := s.c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	var follower *tc.Node
	for _, nd := range s.c.Nodes() {
		if nd != s.leader {
			follower = nd
			break
		}
	}
	fsmBytes := fileSize(b, filepath.Join(follower.DataDir(), "fsm.db"))
	out := []metric{
		{float64(fsmBytes) / float64(n*payloadSize), "fsm_bytes_per_payload_byte"},
		{float64(diskUsage(b, follower.DataDir())) / float64(n*payloadSize), "disk_bytes_per_payload_byte"},
		{restartTime(ctx, b, follower), "follower_ready_s"},
	}
	// The leader last: its kill forces an election the others must win.
	out = append(out, metric{restartTime(ctx, b, s.leader), "leader_ready_s"})
	return out
}

// restartTime kills nd, restarts it and returns the seconds until /readyz.
func restartTime(ctx context.Context, b *testing.B, nd *tc.Node) float64 {
	nd.Kill()
	from := fileSize(b, nd.LogPath())
	start := time.Now()
	nd.Restart()
	if err := nd.WaitReady(ctx); err != nil {
		b.Fatalf("%s not ready after restart: %v", nd, err)
	}
	d := time.Since(start)
	b.Logf("%s ready %v after restart", nd, d.Round(time.Millisecond))
	keepRestartLog(b, nd, from)
	return d.Seconds()
}

// keepRestartLog logs the lines nd wrote since offset from that say how
// long a step took, and copies them all into -restart.logs if set.
func keepRestartLog(b *testing.B, nd *tc.Node, from int64) {
	f, err := os.Open(nd.LogPath())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf, err := io.ReadAll(io.NewSectionReader(f, from, math.MaxInt64-from))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(buf)) {
		if strings.Contains(line, "took=") {
			b.Logf("%s: %s", nd, strings.TrimSpace(line))
		}
	}
	if *flagRestartLogs == "" {
		return
	}
	name := strings.NewReplacer("/", "_", "=", "-").Replace(b.Name()) + "-" + nd.ID() + ".log"
	if err := os.WriteFile(filepath.Join(*flagRestartLogs, name), buf, 0o644); err != nil {
		b.Fatal(err)
	}
}

// diskUsage is the disk space the files under dir take (allocated blocks,
// as du counts them: raft-wal preallocates its segments).
func diskUsage(b *testing.B, dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return total
}

func fileSize(b *testing.B, path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}
