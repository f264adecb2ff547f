package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// fsyncRate measures the disk under dir as a write-ahead log sees it: one
// writer appending size bytes and fsyncing after each append, for d (or
// until ctx ends). It returns the appends made durable per second.
//
// This is the ceiling of a serial publisher on a broker that makes each
// write durable before answering: one fsync per message at best. An R3
// hashicorp/raft cluster fsyncs on the leader and then on a follower, one
// after the other, so 0.5 of this rate bounds mqd's publish-1.
func fsyncRate(ctx context.Context, dir string, size int, d time.Duration) (float64, error) {
	f, err := os.CreateTemp(dir, "fsync-rate-")
	if err != nil {
		return 0, fmt.Errorf("fsync rate: %w", err)
	}
	name := f.Name()
	defer os.Remove(name)
	defer f.Close()
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	var n int
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		if _, err := f.Write(buf); err != nil {
			return 0, fmt.Errorf("fsync rate: write %s: %w", filepath.Base(name), err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("fsync rate: fsync %s: %w", filepath.Base(name), err)
		}
		n++
	}
	if n == 0 { // only when ctx ended first
		return 0, fmt.Errorf("fsync rate: interrupted before the first fsync: %w", ctx.Err())
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
