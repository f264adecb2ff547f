package raftfsm

import (
	"log/slog"
	"testing"
)

func TestParseMinFree(t *testing.T) {
	const total = 100 << 30 // a 100 GiB filesystem
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"", 1 << 30},        // default: 5 %, at most 1 GiB
		{"1048576", 1 << 20}, // bytes
		{"512KiB", 512 << 10},
		{"2MiB", 2 << 20},
		{"3GiB", 3 << 30},
		{"1TiB", 1 << 40},
		{"10%", 10 << 30},
		{"0.5%", total / 200},
		{"0", 0}, // off
		{"0%", 0},
	} {
		m, err := ParseMinFree(c.in)
		if err != nil {
			t.Errorf("ParseMinFree(%q): %v", c.in, err)
			continue
		}
		if got := m.threshold(total); got != c.want {
			t.Errorf("ParseMinFree(%q).threshold = %d, want %d", c.in, got, c.want)
		}
	}
	if got := (MinFree{}).threshold(1 << 30); got != (1<<30)/20 {
		t.Errorf("default on 1 GiB = %d, want 5 %%", got)
	}
	for _, bad := range []string{"-1", "1GB", "x", "100%", "-5%", "1.5MiB", "99999999999999TiB"} {
		if _, err := ParseMinFree(bad); err == nil {
			t.Errorf("ParseMinFree(%q) accepted", bad)
		}
	}
}

// raft-wal's segments are a 16th of the filesystem at most, between 1 and
// 64 MiB.
func TestWalSegmentFor(t *testing.T) {
	for _, c := range []struct{ total, want uint64 }{
		{64 << 20, 4 << 20}, {256 << 20, 16 << 20}, {1 << 30, 64 << 20}, {1 << 40, 64 << 20},
		{8 << 20, 1 << 20}, {0, 1 << 20}, {300 << 20, 16 << 20},
	} {
		if got := walSegmentFor(c.total); uint64(got) != c.want {
			t.Errorf("walSegmentFor(%d) = %d, want %d", c.total, got, c.want)
		}
	}
}

// The leader counts what it admits between two probe rounds against the
// least margin a member reported, four times over, and starts again at
// each round; a data group's leader, against its members' only.
func TestMemberMargin(t *testing.T) {
	var m memberMargin
	if _, over := m.admit(1<<30, nil); over {
		t.Fatal("refused before any probe round")
	}
	r := newMarginRound()
	r.add("a", Status{DiskFree: 100 << 20, DiskKeep: 60 << 20}) // 40 MiB margin
	r.add("b", Status{DiskFree: 100 << 20, DiskKeep: 90 << 20}) // 10 MiB
	r.add("c", Status{DiskFree: 5 << 20})                       // no floor reported: ignored
	m.set(r)
	if _, over := m.admit(2<<20, nil); over { // 8 MiB counted
		t.Fatal("refused within the margin")
	}
	if id, over := m.admit(1<<20, nil); !over || id != "b" { // 12 MiB counted
		t.Fatalf("admit past the least margin: %q %v, want b refused", id, over)
	}
	m.set(newMarginRound()) // a round where nobody reported a floor
	if _, over := m.admit(1<<30, nil); over {
		t.Fatal("refused with no member margin known")
	}
	r = newMarginRound()
	r.add("a", Status{DiskFree: 50, DiskKeep: 60}) // under its floor: margin 0
	m.set(r)
	if _, over := m.admit(1, nil); !over {
		t.Fatal("admitted with a member at its floor")
	}
	// A data group's leader weighs its group's members only
	// (GroupView.CheckDisk): a member low on disk, or with little margin,
	// refuses nothing in a group it holds no replica of.
	r = newMarginRound()
	r.add("a", Status{DiskFree: 100 << 20, DiskKeep: 60 << 20}) // 40 MiB
	r.add("b", Status{DiskFree: 100 << 20, DiskKeep: 99 << 20}) // 1 MiB
	r.add("c", Status{DiskLow: true})
	m.set(r)
	onlyA := func(id string) bool { return id == "a" }
	if id := m.low(nil); id != "c" {
		t.Fatalf("low member of all: %q, want c", id)
	}
	if id := m.low(onlyA); id != "" {
		t.Fatalf("low member among [a]: %q, want none", id)
	}
	if id, over := m.admit(1<<20, onlyA); over { // 4 MiB counted
		t.Fatalf("refused for %s, outside the members asked of", id)
	}
	if id, over := m.admit(1<<20, nil); !over || id != "b" { // 8 MiB counted
		t.Fatalf("admit past b's margin: %q %v, want b refused", id, over)
	}
}

// Every group the node holds keeps its own raft-wal segment and next
// snapshot free (data groups are the default: a node holds several), not
// only the default group's; a group that leaves stops counting.
func TestDiskGuardCountsEveryGroup(t *testing.T) {
	dir := t.TempDir()
	free, _, err := fsSpace(dir)
	if err != nil {
		t.Fatal(err)
	}
	if free < 1<<30 {
		t.Skipf("needs 1 GiB free in %s, has %d", dir, free)
	}
	// Margins of hundreds of MiB: other processes' writes meanwhile move
	// the free space by far less.
	g := newDiskGuard(dir, MinFree{Bytes: free - 400<<20}, slog.Default())
	const mib = 1 << 20
	g.track("default", func() uint64 { return 100 * mib }, 64*mib)
	if g.lowNow() {
		t.Fatalf("low with 164 MiB kept of a 400 MiB margin: need %d, free %d", g.need.Load(), g.free.Load())
	}
	g.track("g1", func() uint64 { return 100 * mib }, 64*mib)
	if g.lowNow() {
		t.Fatalf("low with 328 MiB kept of a 400 MiB margin: need %d, free %d", g.need.Load(), g.free.Load())
	}
	g.track("g2", func() uint64 { return 100 * mib }, 64*mib)
	if !g.lowNow() {
		t.Fatalf("not low with 492 MiB kept of a 400 MiB margin: need %d, free %d", g.need.Load(), g.free.Load())
	}
	g.untrack("g2")
	if g.lowNow() {
		t.Fatalf("low after g2 left: need %d, free %d", g.need.Load(), g.free.Load())
	}
}
