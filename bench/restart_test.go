package bench

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var flagRestartMB = flag.String("restart.mb", "100",
	"Restart: comma-separated retained payload sizes in MiB, one sub-benchmark each (e.g. 100,1024)")

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
//	go test -run '^$' -bench Restart -benchtime 1x ./bench/ -restart.mb 100,1024
func BenchmarkRestart(b *testing.B) {
	for _, f := range strings.Split(*flagRestartMB, ",") {
		mb, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || mb <= 0 {
			b.Fatalf("-restart.mb: %q is not a positive number of MiB", f)
		}
		for _, c := range []struct {
			name  string
			flags []string
		}{{"policy", nil}, {"all", []string{"--snapshot-interval", "24h"}}} {
			b.Run(fmt.Sprintf("retained=%dMiB/log=%s", mb, c.name), func(b *testing.B) {
				fixed(b, func(b *testing.B) []metric { return restartAfterBacklog(b, mb, c.flags) })
			})
		}
	}
}

func restartAfterBacklog(b *testing.B, mb int, flags []string) []metric {
	s := startSystem(b, 3, flags...)
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
	start := time.Now()
	nd.Restart()
	if err := nd.WaitReady(ctx); err != nil {
		b.Fatalf("%s not ready after restart: %v", nd, err)
	}
	d := time.Since(start)
	b.Logf("%s ready %v after restart", nd, d.Round(time.Millisecond))
	return d.Seconds()
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
