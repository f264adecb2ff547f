package raftfsm

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mqd/mqd/internal/refusal"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrInsufficientStorage refuses a write that adds data while the data
// dir's filesystem has less free space than --min-free-disk.
var ErrInsufficientStorage = refusal.New(507, "insufficient_storage", "insufficient storage")

// MinFree is the free space to keep on the data dir's filesystem: Bytes,
// or, when Percent > 0, that percentage of the filesystem's size.
type MinFree struct {
	Bytes   uint64
	Percent float64
}

// Default free-space threshold: 5 % of the filesystem, at most 1 GiB.
const (
	defaultMinFreePercent = 5
	defaultMinFreeCap     = 1 << 30
)

// ParseMinFree parses --min-free-disk: bytes ("1073741824"), a size with a
// KiB/MiB/GiB/TiB suffix ("512MiB"), or a percentage ("5%"). "" is the
// default (5 %, at most 1 GiB); "0" turns the check off.
func ParseMinFree(s string) (MinFree, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return MinFree{}, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v >= 100 {
			return MinFree{}, fmt.Errorf("min free disk %q: a percentage must be in [0, 100)", s)
		}
		if v == 0 {
			return MinFree{Percent: -1}, nil // off
		}
		return MinFree{Percent: v}, nil
	}
	mult := uint64(1)
	for i, suf := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if p, ok := strings.CutSuffix(s, suf); ok {
			s, mult = p, 1<<(10*(i+1))
			break
		}
	}
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || v > (1<<63)/mult {
		return MinFree{}, fmt.Errorf("min free disk %q: want bytes, a KiB/MiB/GiB/TiB size or a percentage", s)
	}
	if v == 0 {
		return MinFree{Percent: -1}, nil // off
	}
	return MinFree{Bytes: v * mult}, nil
}

// threshold is the free bytes to keep on a filesystem of total bytes.
func (m MinFree) threshold(total uint64) uint64 {
	switch {
	case m.Percent < 0:
		return 0
	case m.Percent > 0:
		return uint64(float64(total) * m.Percent / 100)
	case m.Bytes > 0:
		return m.Bytes
	}
	return min(total*defaultMinFreePercent/100, defaultMinFreeCap)
}

// diskRefresh is how old a free-space reading may be.
const diskRefresh = time.Second

// diskGuard answers "is there room for more data" from a statfs of the
// data dir at most diskRefresh old, so the check costs a publish a few
// atomic operations. Between readings it counts the bytes it admitted
// (twice: the raft log and the state both store them) and reads again as
// soon as they may have used up the margin over the threshold, so a fast
// writer cannot run the disk full within one refresh interval.
type diskGuard struct {
	dir    string
	min    MinFree
	logger *slog.Logger

	mu       sync.Mutex // one statfs at a time
	checked  atomic.Int64
	free     atomic.Uint64
	need     atomic.Uint64
	admitted atomic.Uint64 // bytes admitted since the last reading, times two
	low      atomic.Bool
	extra    atomic.Uint64 // kept free on top of the threshold (reserve)
}

// reserve keeps size bytes free on top of the threshold (unless the check
// is off): room for the next raft-wal segment, which is preallocated whole
// when the current one is full, so that acks and other small writes can
// still be logged once publishes are refused.
func (g *diskGuard) reserve(size uint64) {
	if g.min.Percent >= 0 {
		g.extra.Store(size)
	}
	g.checked.Store(0) // read again with it
}

func newDiskGuard(dir string, min MinFree, logger *slog.Logger) *diskGuard {
	g := &diskGuard{dir: dir, min: min, logger: logger}
	g.refresh(time.Now())
	return g
}

// isLow reports whether free space is under the threshold; size is what
// the write would add (0 to just ask).
func (g *diskGuard) isLow(size int) bool {
	now := time.Now()
	stale := now.UnixNano()-g.checked.Load() > int64(diskRefresh)
	if !g.low.Load() {
		used := g.admitted.Add(2 * uint64(size))
		free, need := g.free.Load(), g.need.Load()
		stale = stale || free < need || used > free-need
	}
	if stale {
		g.refresh(now)
	}
	return g.low.Load()
}

func (g *diskGuard) refresh(now time.Time) {
	if !g.mu.TryLock() {
		return // another caller is reading it
	}
	defer g.mu.Unlock()
	var st syscall.Statfs_t
	if err := syscall.Statfs(g.dir, &st); err != nil {
		g.logger.Warn("statfs of the data dir", "dir", g.dir, "err", err)
		g.checked.Store(now.UnixNano())
		return
	}
	free, total := st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize)
	need := g.min.threshold(total) + g.extra.Load()
	g.free.Store(free)
	g.need.Store(need)
	g.admitted.Store(0)
	low := free < need
	if was := g.low.Swap(low); was != low {
		if low {
			g.logger.Warn("free disk space under --min-free-disk: refusing writes that add data (507)", "free", free, "min", need)
		} else {
			g.logger.Info("free disk space back over --min-free-disk: accepting writes", "free", free, "min", need)
		}
	}
	g.checked.Store(now.UnixNano())
}

// CheckDisk answers ErrInsufficientStorage while the data dir's
// filesystem has less free space than --min-free-disk, here or, by its
// latest probe answer, on another member (every member stores what the
// leader commits). Writes that add data (publish, topic creation, replay)
// call it on the leader with about the bytes they add; consumption does
// not.
func (n *Node) CheckDisk(size int) error {
	if n.disk.isLow(size) {
		return fmt.Errorf("%w: node %s has %d bytes free on its data dir's filesystem, under its --min-free-disk (%d bytes); consumption still works",
			ErrInsufficientStorage, n.cfg.ID, n.disk.free.Load(), n.disk.need.Load())
	}
	if id, _ := n.lowMember.Load().(string); id != "" {
		return fmt.Errorf("%w: member %s has less free space on its data dir than its --min-free-disk; consumption still works", ErrInsufficientStorage, id)
	}
	return nil
}

func (g *diskGuard) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_disk_free_bytes",
			Help: "Free bytes on the data dir's filesystem (at most 1 s old)."},
			func() float64 { _ = g.isLow(0); return float64(g.free.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_disk_min_free_bytes",
			Help: "--min-free-disk in bytes: under it, writes that add data answer 507."},
			func() float64 { _ = g.isLow(0); return float64(g.need.Load()) }),
	}
}

// exit ends the process; a variable so that a test can see the call.
var exit = osExit

var osExit = os.Exit

// stopOnStorageError ends the process when the state file cannot take a
// committed batch (a full disk, an I/O error). Skipping the batch would let
// replicas diverge and retrying in place would block raft; the entries are
// in the fsynced raft log, so a restart once the disk has room applies
// them again and nothing acknowledged is lost.
func stopOnStorageError(logger *slog.Logger, index uint64, err error) {
	logger.Error("stopping: the state file cannot be written; free space or fix the disk, then restart (committed entries are in the raft log and are applied again)",
		"index", index, "err", err)
	exit(1)
}
