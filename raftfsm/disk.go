package raftfsm

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mqd/mqd/internal/refusal"
	"github.com/mqd/mqd/replica"
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
// (twice: the raft log and the state both store them; four times once
// the groups' next snapshots are counted too, which grow with the state,
// and the state takes up to 1.34 bytes per payload byte) and reads again as soon
// as they may have used up the margin over the threshold, so a fast
// writer cannot run the disk full within one refresh interval.
type diskGuard struct {
	dir    string
	min    MinFree
	logger *slog.Logger

	mu       sync.Mutex // one statfs at a time
	checked  atomic.Int64
	free     atomic.Uint64
	need     atomic.Uint64
	admitted atomic.Uint64 // bytes admitted since the last reading, times perByte
	perByte  atomic.Uint64 // disk bytes to count per byte admitted
	low      atomic.Bool

	gmu    sync.Mutex
	groups map[string]groupSpace // by raft group id: what each held group keeps free
}

// groupSpace is what one raft group the node holds keeps free on top of
// the threshold (unless the check is off): the bytes its next snapshot
// writes (FSM.NextSnapshotSize), which the node writes itself whatever it
// refuses, and one that fills the disk fails and leaves the log growing;
// and room for its next raft-wal segment, which is preallocated whole when
// the current one is full, so that acks and other small writes can still
// be logged once publishes are refused.
type groupSpace struct {
	snapshot func() uint64
	segment  uint64
}

// track counts group id's space (groupSpace) from now on: the default
// group and every data group the node opens, each with a log and state
// files of its own.
func (g *diskGuard) track(id string, snapshot func() uint64, segment uint64) {
	if g.min.Percent < 0 {
		return
	}
	g.gmu.Lock()
	if g.groups == nil {
		g.groups = map[string]groupSpace{}
	}
	g.groups[id] = groupSpace{snapshot: snapshot, segment: segment}
	g.gmu.Unlock()
	g.perByte.Store(4)
	g.checked.Store(0) // read again with it
}

// untrack stops counting group id (closed, or moved off this node).
func (g *diskGuard) untrack(id string) {
	g.gmu.Lock()
	delete(g.groups, id)
	g.gmu.Unlock()
	g.checked.Store(0)
}

// segments is the bytes the held groups' next raft-wal segments take.
func (g *diskGuard) segments() uint64 {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	var sum uint64
	for _, s := range g.groups {
		sum += s.segment
	}
	return sum
}

// snapshots is the bytes the held groups' next snapshots write.
func (g *diskGuard) snapshots() uint64 {
	g.gmu.Lock()
	fns := make([]func() uint64, 0, len(g.groups))
	for _, s := range g.groups {
		fns = append(fns, s.snapshot)
	}
	g.gmu.Unlock()
	var sum uint64
	for _, fn := range fns {
		sum += fn() // outside gmu: it reads the group's state file
	}
	return sum
}

func newDiskGuard(dir string, min MinFree, logger *slog.Logger) *diskGuard {
	g := &diskGuard{dir: dir, min: min, logger: logger}
	g.perByte.Store(2)
	g.refresh(time.Now())
	return g
}

// isLow reports whether free space is under the threshold; size is what
// the write would add (0 to just ask).
func (g *diskGuard) isLow(size int) bool {
	now := time.Now()
	stale := now.UnixNano()-g.checked.Load() > int64(diskRefresh)
	if !g.low.Load() {
		used := g.admitted.Add(g.perByte.Load() * uint64(size))
		free, need := g.free.Load(), g.need.Load()
		stale = stale || free < need || used > free-need
	}
	if stale {
		g.refresh(now)
	}
	return g.low.Load()
}

// lowNow reads free space afresh (unless another caller is) and reports
// whether it is under the threshold: a member's status answer, which the
// leader probes every probeEvery and refuses writes by, so that the
// leader learns of a follower getting low within one probe rather than
// one probe plus diskRefresh.
func (g *diskGuard) lowNow() bool {
	g.refresh(time.Now())
	return g.low.Load()
}

func (g *diskGuard) refresh(now time.Time) {
	if !g.mu.TryLock() {
		return // another caller is reading it
	}
	defer g.mu.Unlock()
	free, total, err := fsSpace(g.dir)
	if err != nil {
		g.logger.Warn("statfs of the data dir", "dir", g.dir, "err", err)
		g.checked.Store(now.UnixNano())
		return
	}
	need := g.min.threshold(total) + g.segments() + g.snapshots()
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
// not. A data group's view asks it of the group's members only
// (GroupView.CheckDisk).
func (n *Node) CheckDisk(size int) error { return n.checkDisk(size, nil) }

// checkDisk is CheckDisk for the members member reports true for (nil:
// every member).
func (n *Node) checkDisk(size int, member func(id string) bool) error {
	if n.disk.isLow(size) {
		return fmt.Errorf("%w: node %s has %d bytes free on its data dir's filesystem, under the %d bytes it keeps free (--min-free-disk, a raft-wal segment and its next snapshot); consumption still works",
			ErrInsufficientStorage, n.cfg.ID, n.disk.free.Load(), n.disk.need.Load())
	}
	if id := n.memberDisk.low(member); id != "" {
		return fmt.Errorf("%w: member %s has less free space on its data dir than its --min-free-disk; consumption still works", ErrInsufficientStorage, id)
	}
	if id, over := n.memberDisk.admit(size, member); over {
		return fmt.Errorf("%w: member %s may be under its --min-free-disk by now (what was admitted since its last status uses up its margin); consumption still works", ErrInsufficientStorage, id)
	}
	return nil
}

// memberMargin is what the leader knows of the other members' free space
// between two probes: which members reported disk_low, the margin over its
// floor each other one reported (free minus what it keeps), and the bytes
// admitted since, counted four times as the node counts its own (log,
// state, next snapshot). A write that would use up the least margin among
// the members that store it is refused until the next probe round, so a
// fast writer cannot run a follower's disk full in the half second before
// its status says disk_low. The bytes admitted are the node's, whatever
// group they went to: a member of one group is charged for another's
// writes (the cautious side).
type memberMargin struct {
	mu       sync.Mutex
	margins  map[string]uint64 // by member that reported one
	lows     []string          // members whose latest answer said disk_low, sorted
	admitted atomic.Uint64
	known    atomic.Bool
}

// marginRound collects the members' margins of one probe round.
type marginRound struct {
	margins map[string]uint64
	lows    []string
}

func newMarginRound() *marginRound { return &marginRound{margins: map[string]uint64{}} }

func (r *marginRound) add(id string, st Status) {
	if st.DiskLow {
		r.lows = append(r.lows, id)
		return
	}
	if st.DiskKeep == 0 {
		return // check off, or a binary that does not report it
	}
	m := uint64(0)
	if st.DiskFree > st.DiskKeep {
		m = st.DiskFree - st.DiskKeep
	}
	r.margins[id] = m
}

func (m *memberMargin) set(r *marginRound) {
	slices.Sort(r.lows) // low answers the first: the same member every time
	m.mu.Lock()
	m.margins, m.lows = r.margins, r.lows
	m.admitted.Store(0)
	m.mu.Unlock()
	m.known.Store(true)
}

// low is a member low on disk among those member reports true for (nil:
// any), or "".
func (m *memberMargin) low(member func(string) bool) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range m.lows {
		if member == nil || member(id) {
			return id
		}
	}
	return ""
}

// admit counts size bytes and reports whether they would use up the least
// margin among the members member reports true for (nil: all), and whose
// it is.
func (m *memberMargin) admit(size int, member func(string) bool) (string, bool) {
	if !m.known.Load() || size == 0 {
		return "", false
	}
	used := m.admitted.Add(4 * uint64(size))
	m.mu.Lock()
	defer m.mu.Unlock()
	id, least := "", uint64(math.MaxUint64)
	for mid, mg := range m.margins {
		if (member == nil || member(mid)) && (mg < least || mg == least && mid < id) {
			id, least = mid, mg
		}
	}
	if least == math.MaxUint64 || used <= least {
		return "", false
	}
	return id, true
}

func (g *diskGuard) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_disk_free_bytes",
			Help: "Free bytes on the data dir's filesystem (at most 1 s old)."},
			func() float64 { _ = g.isLow(0); return float64(g.free.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "mqd_disk_min_free_bytes",
			Help: "Free bytes the node keeps: --min-free-disk, plus one raft-wal segment and the next snapshot's size; under it, writes that add data answer 507."},
			func() float64 { _ = g.isLow(0); return float64(g.need.Load()) }),
	}
}

// raft-wal segment sizes: raft-wal preallocates each segment whole, so a
// segment must fit the data dir's filesystem many times over.
const (
	walSegmentMax = 64 << 20 // raft-wal's default, on a filesystem of 1 GiB or more
	walSegmentMin = 1 << 20
	// walSegmentsPerFS: a segment is at most this fraction of the
	// filesystem's size.
	walSegmentsPerFS = 16
	// startSlack is the room a new node needs besides its first segment:
	// fsm.db, raft.db and wal-meta.db as bbolt creates them.
	startSlack = 1 << 20
)

// walSegmentFor sizes raft-wal's segments to a filesystem of total bytes:
// 64 MiB, halved while that is more than a 16th of the filesystem, at
// least 1 MiB (64 MiB volume: 4 MiB; 256 MiB: 16 MiB). An entry larger
// than a segment is still written whole (raft-wal lets the segment run
// over). The size is recorded in each segment, so a data dir moved to
// another volume keeps its segments and sizes new ones anew.
func walSegmentFor(total uint64) int {
	seg := uint64(walSegmentMax)
	for seg > walSegmentMin && seg*walSegmentsPerFS > total {
		seg /= 2
	}
	return int(seg)
}

// fsSpace reads the free and total bytes of the filesystem holding dir.
func fsSpace(dir string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// walSegmentSize is the segment size for the data dir's filesystem
// (walSegmentMax if it cannot be read).
func walSegmentSize(dir string) int {
	_, total, err := fsSpace(dir)
	if err != nil {
		return walSegmentMax
	}
	return walSegmentFor(total)
}

// checkStartSpace refuses to create a new node in dir when its filesystem
// cannot hold what the first start writes: one raft-wal segment (with the
// wal store) and the state files. A node with state starts on any free
// space, a full disk included, and serves reads.
func checkStartSpace(dir, logStore string) error {
	free, total, err := fsSpace(dir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	need := uint64(startSlack)
	if logStore == replica.LogStoreWAL {
		need += uint64(walSegmentFor(total))
	}
	if free < need {
		return fmt.Errorf("data dir %s: its filesystem has %d bytes free (of %d); a new node needs at least %d: %d for its first raft-wal segment (a 16th of the filesystem, 1 to 64 MiB) and %d for its state files",
			dir, free, total, need, need-startSlack, uint64(startSlack))
	}
	return nil
}
