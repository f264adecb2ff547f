package raftfsm

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"syscall"
)

// Resources are what this node's process uses of its machine, for the
// console's resource card (GET /v1/cluster's "resources").
type Resources struct {
	DiskFreeBytes    uint64 `json:"disk_free_bytes"`
	DiskTotalBytes   uint64 `json:"disk_total_bytes"`
	DiskMinFreeBytes uint64 `json:"disk_min_free_bytes"` // --min-free-disk as bytes on this filesystem (0: off)
	DiskLow          bool   `json:"disk_low"`
	MemoryRSSBytes   uint64 `json:"memory_rss_bytes"` // 0 where /proc is not there
	GoHeapBytes      uint64 `json:"go_heap_bytes"`
	GoSysBytes       uint64 `json:"go_sys_bytes"`
	Goroutines       int    `json:"goroutines"`
	OpenFiles        int    `json:"open_files"` // -1 where /proc is not there
	OpenFilesLimit   uint64 `json:"open_files_limit"`
	ClockOffsetMs    int64  `json:"clock_offset_ms"` // this node's clock minus the cluster's
	ClockKnown       bool   `json:"clock_known"`
	ClockBad         bool   `json:"clock_bad"`
	ClockReason      string `json:"clock_reason,omitempty"`
	MaxClockOffsetMs int64  `json:"max_clock_offset_ms"`
}

// Resources reads this node's resources now: a statfs of the data dir,
// /proc/self, the runtime's memory figures and the clock's judgement.
func (n *Node) Resources() Resources {
	var r Resources
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.cfg.DataDir, &st); err == nil {
		r.DiskFreeBytes, r.DiskTotalBytes = st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize)
		r.DiskMinFreeBytes = n.cfg.MinFreeDisk.threshold(r.DiskTotalBytes) + n.disk.segments()
		r.DiskLow = r.DiskFreeBytes < r.DiskMinFreeBytes
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.GoHeapBytes, r.GoSysBytes, r.Goroutines = ms.HeapAlloc, ms.Sys, runtime.NumGoroutine()
	r.MemoryRSSBytes = rss()
	r.OpenFiles = -1
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		r.OpenFiles = len(fds)
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		r.OpenFilesLimit = rl.Cur
	}
	c := n.Clock()
	r.ClockOffsetMs, r.ClockKnown, r.ClockBad, r.ClockReason = c.Offset.Milliseconds(), c.Known, c.Bad, c.Reason
	r.MaxClockOffsetMs = n.cfg.MaxClockOffset.Milliseconds()
	return r
}

// rss is the process's resident set size from /proc/self/statm, 0 when
// it cannot be read.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
