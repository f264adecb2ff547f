package raftfsm

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The service clock follows the monotonic clock and moves toward the wall
// clock by at most 1 % of the time elapsed, ahead or back, and never goes
// back itself.
func TestServiceClockSlews(t *testing.T) {
	var c serviceClock
	m := time.Now()
	const base = int64(1_000_000) * int64(time.Second)
	if v := c.step(m, base); v != base {
		t.Fatalf("first reading %d, want the wall clock %d", v, base)
	}
	day := int64(24 * time.Hour)
	// The wall clock steps 8 days ahead; 10 s pass: 10.1 s of service time.
	m = m.Add(10 * time.Second)
	if v := c.step(m, base+8*day+int64(10*time.Second)); v != base+int64(10100*time.Millisecond) {
		t.Fatalf("after a jump ahead: %v past the start, want 10.1 s", time.Duration(v-base))
	}
	// Put right (behind the service clock): 10 s pass: 9.9 s.
	prev := c.ns
	m = m.Add(10 * time.Second)
	if v := c.step(m, base+int64(20*time.Second)); v != prev+int64(9900*time.Millisecond) {
		t.Fatalf("after the clock was put right: %v later, want 9.9 s", time.Duration(v-prev))
	}
	// Within reach: it joins the wall clock.
	m = m.Add(10 * time.Second)
	wall := c.ns + int64(10*time.Second) - int64(50*time.Millisecond)
	if v := c.step(m, wall); v != wall {
		t.Fatalf("within 1 %%: %d, want the wall clock %d", v, wall)
	}
	// A monotonic reading earlier than the last one does not move it back.
	prev = c.ns
	if v := c.step(m.Add(-time.Second), wall-day); v != prev {
		t.Fatalf("a reading earlier than the last: %d, want %d", v, prev)
	}
	// Held (a wall clock refused at start): the monotonic clock only.
	c.hold = true
	prev = c.ns
	m = m.Add(10 * time.Second)
	if v := c.step(m, wall+8*day); v != prev+int64(10*time.Second) {
		t.Fatalf("held: %v later, want 10 s", time.Duration(v-prev))
	}
}

// At start on the same boot, the wall clock is compared with the recorded
// one plus the time down (the boot-time clock): 8 days ahead is refused
// unless accepted, and the service clock resumes from the recorded one
// plus the time down either way; another boot trusts the wall clock.
func TestCheckClockAtStart(t *testing.T) {
	dir := t.TempDir()
	uptimePath = filepath.Join(dir, "uptime")
	bootIDPath = filepath.Join(dir, "boot_id")
	t.Cleanup(func() { uptimePath, bootIDPath = "/proc/uptime", "/proc/sys/kernel/random/boot_id" })
	if err := os.WriteFile(bootIDPath, []byte("boot-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(uptimePath, []byte("1000.00 5.00\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wall := Wall()
	day := 24 * time.Hour
	cases := []struct {
		name         string
		boot         string
		recWall      time.Time // recorded 2 s of uptime ago
		accept       bool
		wantRefused  bool
		wantResumeMs int64 // the service clock, about
	}{
		{"8 days ahead", "boot-1", wall.Add(-8 * day).Add(-2 * time.Second), false, true, wall.Add(-8 * day).UnixMilli()},
		{"8 days ahead, accepted", "boot-1", wall.Add(-8 * day).Add(-2 * time.Second), true, false, wall.Add(-8 * day).UnixMilli()},
		{"on time", "boot-1", wall.Add(-2 * time.Second), false, false, wall.UnixMilli()},
		{"8 days behind", "boot-1", wall.Add(8 * day).Add(-2 * time.Second), false, false, wall.Add(8 * day).UnixMilli()},
		{"another boot", "boot-0", wall.Add(-8 * day), false, false, wall.UnixMilli()},
	}
	for _, tc := range cases {
		rec := `{"boot_id":"` + tc.boot + `","uptime_ns":` + strconv.FormatInt(int64(998*time.Second), 10) +
			`,"wall_ms":` + strconv.FormatInt(tc.recWall.UnixMilli(), 10) + `,"service_ms":` + strconv.FormatInt(tc.recWall.UnixMilli(), 10) + `}`
		if err := os.WriteFile(filepath.Join(dir, clockFile), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
		n := &Node{cfg: Config{DataDir: dir, MaxClockOffset: DefaultMaxClockOffset, AcceptClock: tc.accept}, logger: slog.New(slog.DiscardHandler)}
		n.checkClockAtStart(0)
		if _, refused := n.soloClockBad(); refused != tc.wantRefused {
			t.Errorf("%s: refused %v, want %v", tc.name, refused, tc.wantRefused)
		}
		if got := Now().UnixMilli(); got < tc.wantResumeMs-1000 || got > tc.wantResumeMs+1000 {
			t.Errorf("%s: service clock resumed at %v, want about %v", tc.name, time.UnixMilli(got).UTC(), time.UnixMilli(tc.wantResumeMs).UTC())
		}
		if tc.wantRefused {
			// The clock put right while refused (where it should be by the
			// record): no longer refused.
			put := &Node{cfg: n.cfg, logger: n.logger}
			put.checkClockAtStart(0)
			put.clockStart.expected, put.clockStart.at = Wall(), time.Now()
			if _, refused := put.soloClockBad(); refused || put.clockStart.pending.Load() {
				t.Errorf("%s: still refused once the clock is where the record expects it", tc.name)
			}
			if _, ok := n.AcceptClock(); !ok {
				t.Errorf("%s: AcceptClock found nothing refused", tc.name)
			}
			if _, refused := n.soloClockBad(); refused {
				t.Errorf("%s: still refused after AcceptClock", tc.name)
			}
		}
	}
	service.resume(Wall().UnixNano(), false) // the rest of the package's tests: the wall clock
}

// BenchmarkServiceClockNow: the cost of a reading of the service clock
// (a mutex and a monotonic reading), read by every request that stamps or
// compares time, from all cores at once.
func BenchmarkServiceClockNow(b *testing.B) {
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = Now()
		}
	})
}

// BenchmarkWallNow is the wall clock reading it replaced, for comparison.
func BenchmarkWallNow(b *testing.B) {
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = Wall()
		}
	})
}
