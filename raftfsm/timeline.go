package raftfsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Service time. The leader stamps commands with the service clock (Now),
// not with its wall clock: the service clock advances with the monotonic
// clock and moves toward the wall clock by at most 1 % of the time elapsed
// (slewDivisor). A wall clock stepped ahead (or back) therefore moves the
// state's time by 10 ms a second, not at once: a jump ahead does not expire
// leases and dedup keys, and a clock put right after a jump does not freeze
// every expiry until the wall clock catches up with the stamps. While it
// slews, a duration measured in state time (a lease, a delay, a dedup or
// retention window) lasts between 1/1.01 and 1/0.99 of its length in real
// time. The FSM never reads a clock: it applies the stamped time, clamped
// so that it never goes back (fsm/fsm.go, clampNow), on every replica alike.
//
// A node keeps the wall clock it trusts, the service clock and the
// boot-time clock (CLOCK_BOOTTIME, /proc/uptime: it counts a suspend and
// survives the process, not a reboot) in clock.json in its data dir, every
// second and at shutdown. On the same boot the time the node was down is
// then measured exactly, and the service clock resumes where it was plus
// that time; a single-node cluster (no peers to compare clocks with) whose
// wall clock is further ahead of the recorded one plus the time down than
// --max-clock-offset does not lead until its clock is put right or it is
// told to accept it (--accept-clock, POST /v1/cluster/clock/accept); while
// refused, its service clock follows the monotonic clock only. After a reboot the time down cannot be measured: the wall clock is
// trusted (logged). The file is replaced by a rename and not fsynced: a
// process crash keeps the page cache, and a power loss, which may lose the
// write, reboots, so the record is not used anyway.

// slewDivisor: the service clock moves toward the wall clock by at most
// 1/slewDivisor of the monotonic time elapsed. 1 % keeps the error of any
// duration within 1 % (a client renewing a lease at half its length has a
// wide margin) while a step of a second is absorbed in 100 s; NTP's own
// slew is at most 0.05 %, so the service clock follows a disciplined
// wall clock exactly.
const slewDivisor = 100

// serviceClock is the process's service clock (one node per process).
type serviceClock struct {
	mu   sync.Mutex
	mono time.Time // time.Now() at the last reading: its monotonic reading counts
	ns   int64     // the clock's value then (unix ns)
	hold bool      // the wall clock is not trusted: follow the monotonic clock only
	set  bool
}

var service serviceClock

// Now is the node's service clock: what the leader stamps into commands
// and what due times are compared with (see above).
func Now() time.Time { return time.Unix(0, service.read()) }

// Wall is the node's wall clock (with the test-only shift): what the
// status probes compare with the other members'.
func Wall() time.Time {
	d, _ := wallShift()
	return time.Now().Add(d)
}

func (c *serviceClock) read() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := time.Now()
	d, _ := wallShift()
	return c.step(m, m.Add(d).UnixNano())
}

// step advances the clock to the reading m of the monotonic clock, with
// the wall clock at wall (unix ns). c.mu is held.
func (c *serviceClock) step(m time.Time, wall int64) int64 {
	if !c.set {
		c.mono, c.ns, c.set = m, wall, true
		return c.ns
	}
	dt := int64(m.Sub(c.mono))
	if dt <= 0 {
		return c.ns
	}
	v := c.ns + dt
	lim := dt / slewDivisor
	switch gap := wall - v; {
	case c.hold:
	case gap > lim:
		v += lim
	case gap < -lim:
		v -= lim
	default:
		v = wall
	}
	c.mono, c.ns = m, v
	return v
}

// resume sets the clock to ns (unix ns); hold: the wall clock is not
// trusted (the clock then follows the monotonic clock only).
func (c *serviceClock) resume(ns int64, hold bool) {
	c.mu.Lock()
	c.mono, c.ns, c.hold, c.set = time.Now(), ns, hold, true
	c.mu.Unlock()
}

// atLeast moves the clock forward to ns if it is behind it.
func (c *serviceClock) atLeast(ns int64) {
	c.read()
	c.mu.Lock()
	c.ns = max(c.ns, ns)
	c.mu.Unlock()
}

// trust makes the clock slew toward the wall clock as it is.
func (c *serviceClock) trust() {
	c.read()
	c.mu.Lock()
	c.hold = false
	c.mu.Unlock()
}

// clockRecord is clock.json.
type clockRecord struct {
	BootID    string `json:"boot_id"`
	UptimeNs  int64  `json:"uptime_ns"`  // the boot-time clock at the reading
	WallMs    int64  `json:"wall_ms"`    // the wall clock the node trusted then
	ServiceMs int64  `json:"service_ms"` // the service clock then
}

const clockFile = "clock.json"

// uptimePath is the boot-time clock; a variable for tests.
var uptimePath = "/proc/uptime"

// uptime reads the boot-time clock (10 ms resolution).
func uptime() (time.Duration, error) {
	b, err := os.ReadFile(uptimePath)
	if err != nil {
		return 0, err
	}
	f, _, _ := strings.Cut(string(b), " ")
	s, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", uptimePath, err)
	}
	return time.Duration(s * float64(time.Second)), nil
}

// startClock is what the node found of its clock at start.
type startClock struct {
	// On the same boot: where the wall clock should have been at start
	// (the trusted one recorded plus the time down), and when that was
	// (a monotonic reading): the wall clock should be expected plus the
	// time since.
	expected time.Time
	at       time.Time
	down     time.Duration
	pending  atomic.Bool // ahead of expected by more than --max-clock-offset, not accepted
	reported atomic.Bool // the refusal was logged
	mu       sync.Mutex
	rec      clockRecord // the last record written
	writeErr bool
	seen     [2]int64 // the wall clock and the boot-time clock at the last record (ns)
}

// checkClockAtStart reads clock.json (before anything overwrites it),
// resumes the service clock from it and judges the wall clock: see the
// comment at the top. fsmNow is the state's time (unix ms).
func (n *Node) checkClockAtStart(fsmNow int64) {
	sc := &n.clockStart
	wall := Wall()
	up, upErr := uptime()
	boot := bootID()
	rec, err := readClockRecord(filepath.Join(n.cfg.DataDir, clockFile))
	switch {
	case err == nil && upErr == nil && boot != "" && rec.BootID == boot && time.Duration(rec.UptimeNs) <= up:
		sc.down = up - time.Duration(rec.UptimeNs)
		sc.expected, sc.at = time.UnixMilli(rec.WallMs).Add(sc.down), time.Now()
		jump := wall.Sub(sc.expected)
		resumeAt := max(time.UnixMilli(rec.ServiceMs).Add(sc.down).UnixNano(), fsmNow*1e6)
		refuse := jump > n.cfg.MaxClockOffset && !n.cfg.AcceptClock
		sc.pending.Store(refuse)
		service.resume(resumeAt, refuse)
		switch {
		case jump > n.cfg.MaxClockOffset && n.cfg.AcceptClock:
			n.logger.Warn("clock accepted (--accept-clock): it is ahead of the time this node last ran plus the time it was down; the state's time resumes from the time measured and slews toward the clock at 1 %",
				"ahead", jump.Round(time.Millisecond), "down", sc.down.Round(time.Millisecond))
		case jump < -n.cfg.MaxClockOffset:
			n.logger.Warn("clock is behind the time this node last ran plus the time it was down; the state's time resumes from the time measured and slews toward the clock at 1 %",
				"behind", (-jump).Round(time.Millisecond), "down", sc.down.Round(time.Millisecond))
		}
		sc.rec = clockRecord{BootID: boot, UptimeNs: int64(up), WallMs: sc.expected.UnixMilli(), ServiceMs: resumeAt / 1e6}
	default:
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			n.logger.Warn("clock record unreadable: the time this node was down is not known", "err", err)
		}
		service.resume(max(wall.UnixNano(), fsmNow*1e6), false)
		if fsmNow > 0 {
			n.logger.Info("time down not measurable (a reboot, or no clock record): the wall clock is trusted",
				"state_time", time.UnixMilli(fsmNow).UTC(), "clock", wall.UTC())
		}
		sc.rec = clockRecord{BootID: boot, UptimeNs: int64(up), WallMs: wall.UnixMilli(), ServiceMs: Now().UnixMilli()}
	}
}

func readClockRecord(path string) (clockRecord, error) {
	var rec clockRecord
	b, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", path, err)
	}
	return rec, nil
}

// recordClock writes clock.json: the wall clock the node trusts (while a
// jump is refused, the recorded one plus the time since, so a restart does
// not launder it), the service clock and the boot-time clock.
func (n *Node) recordClock() {
	sc := &n.clockStart
	up, err := uptime()
	if err != nil {
		return
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	now := Wall()
	if w, u := sc.seen[0], sc.seen[1]; u > 0 {
		if step := time.Duration(now.UnixNano()-w) - (up - time.Duration(u)); step > n.cfg.MaxClockOffset || step < -n.cfg.MaxClockOffset {
			n.logger.Warn("the wall clock stepped while running: the service clock (the state's time) follows it at 1 % only",
				"step", step.Round(time.Millisecond), "service_lag", now.Sub(Now()).Round(time.Millisecond))
		}
	}
	sc.seen = [2]int64{now.UnixNano(), int64(up)}
	wall := now.UnixMilli()
	if sc.pending.Load() {
		wall = sc.expectedNow().UnixMilli()
	}
	sc.rec = clockRecord{BootID: bootID(), UptimeNs: int64(up), WallMs: wall, ServiceMs: Now().UnixMilli()}
	b, _ := json.Marshal(sc.rec)
	path := filepath.Join(n.cfg.DataDir, clockFile)
	err = os.WriteFile(path+".tmp", b, 0o600)
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err != nil && !sc.writeErr {
		n.logger.Warn("record the clock", "err", err)
	}
	sc.writeErr = err != nil
}

// recordClockLoop records the clock every second until ctx ends.
func (n *Node) recordClockLoop(done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			n.recordClock()
		}
	}
}

// AcceptClock accepts the wall clock of a node that refuses to lead because
// it jumped ahead while the node was down (POST /v1/cluster/clock/accept,
// like --accept-clock at start): it answers how far ahead it was, and
// false when nothing was refused.
func (n *Node) AcceptClock() (time.Duration, bool) {
	sc := &n.clockStart
	jump := Wall().Sub(sc.expectedNow())
	if !sc.pending.Swap(false) {
		return 0, false
	}
	service.trust()
	n.recordClock()
	n.logger.Warn("clock accepted (POST /v1/cluster/clock/accept): the state's time goes on from the time measured and slews toward the clock at 1 %",
		"ahead", jump.Round(time.Millisecond), "down", sc.down.Round(time.Millisecond))
	return jump, true
}

// expectedNow is where the wall clock should be now, by the record.
func (sc *startClock) expectedNow() time.Time { return sc.expected.Add(time.Since(sc.at)) }

// soloClockBad is the refusal of a node with no peers to compare with:
// its wall clock jumped ahead while it was down (same boot) and it was
// not told to accept it.
func (n *Node) soloClockBad() (string, bool) {
	sc := &n.clockStart
	if !sc.pending.Load() {
		return "", false
	}
	jump := Wall().Sub(sc.expectedNow())
	if jump <= n.cfg.MaxClockOffset { // put right meanwhile
		if sc.pending.CompareAndSwap(true, false) {
			service.trust()
			n.logger.Info("clock put right: no longer ahead of the time this node last ran plus the time it was down", "ahead", jump.Round(time.Millisecond))
		}
		return "", false
	}
	return fmt.Sprintf("clock is %v ahead of the time this node last ran plus the %v it was down (measured by the boot-time clock), further than --max-clock-offset %v, and no other voter can vouch for it; accept it with POST /v1/cluster/clock/accept or by starting with --accept-clock",
		jump.Round(time.Millisecond), sc.down.Round(time.Millisecond), n.cfg.MaxClockOffset), true
}

// anchorServiceClock runs when this node starts to lead: the service clock
// is moved up to the state's time (a new leader never stamps earlier than
// the last applied command). With the other voters' clocks measured and
// agreeing, it starts from the wall clock they vouch for, or from its own
// service clock when that is earlier (a wall clock stepped ahead on every
// member at once, one host's clock shared, is not followed at once:
// expiries come late rather than early).
func (n *Node) anchorServiceClock(vouched bool) {
	fsmNow := n.FSM.Now() * 1e6
	if vouched {
		service.resume(max(min(Wall().UnixNano(), service.read()), fsmNow), false)
		n.clockStart.pending.Store(false) // the others vouch for the wall clock
		return
	}
	service.atLeast(fsmNow)
}

// bootIDPath is where Linux exposes a random id drawn at every boot.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID is this boot's id, or "" where the system has none: the clock
// record is then never taken for this boot's.
func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
