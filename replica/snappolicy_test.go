package replica

import "testing"

// The log kept behind a snapshot is bounded in bytes: a quarter of the
// state, at least 64 MiB, at the mean entry size since the last snapshot;
// never more entries than --trailing-logs nor fewer than 16.
func TestTrailingKeep(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		name                                     string
		trailing, size, sinceBytes, sinceN, want uint64
	}{
		{"nothing applied since: the flag", 10240, 1 << 30, 0, 0, 10240},
		{"small entries: the flag", 10240, 100 * MiB, 1 * MiB, 1000, 10240},
		{"1 MiB entries, small state: 64 MiB of them", 10240, 10 * MiB, 100 * MiB, 100, 64},
		{"1 MiB entries, 1 GiB state: a quarter of it", 10240, 1024 * MiB, 100 * MiB, 100, 256},
		{"16 MiB entries: 16 at least", 10240, 10 * MiB, 160 * MiB, 10, 16},
		{"a flag below the floor stands", 8, 10 * MiB, 160 * MiB, 10, 8},
	} {
		if got := TrailingKeep(c.trailing, c.size, c.sinceBytes, c.sinceN); got != c.want {
			t.Errorf("%s: TrailingKeep(%d, %d, %d, %d) = %d, want %d", c.name, c.trailing, c.size, c.sinceBytes, c.sinceN, got, c.want)
		}
	}
}

// A snapshot is due once the log since the last one holds half the state
// (2 MiB for a state under 4 MiB), after --snapshot-threshold entries for
// a small state, or at once to reclaim space; never with nothing new.
func TestSnapshotDue(t *testing.T) {
	const MiB = 1 << 20
	yes := func() bool { return true }
	for _, c := range []struct {
		name string
		s    SnapshotState
		want string // "" for not due
	}{
		{"nothing new", SnapshotState{Applied: 5, LastSnapshot: 5, SinceBytes: 100 * MiB, Reclaim: yes}, ""},
		{"reclaim", SnapshotState{Applied: 6, LastSnapshot: 5, StateSize: 100 * MiB, Reclaim: yes}, "reclaim"},
		{"half the state in log bytes", SnapshotState{Applied: 6, LastSnapshot: 5, StateSize: 100 * MiB, SinceBytes: 50 * MiB, Threshold: 8192}, "log bytes"},
		{"under half", SnapshotState{Applied: 9000, LastSnapshot: 5, StateSize: 100 * MiB, SinceBytes: 50*MiB - 1, Threshold: 8192}, ""},
		{"small state: 2 MiB of log", SnapshotState{Applied: 6, LastSnapshot: 5, StateSize: MiB, SinceBytes: 2 * MiB, Threshold: 8192}, "log bytes"},
		{"small state: the entries", SnapshotState{Applied: 8197, LastSnapshot: 5, StateSize: MiB, SinceBytes: MiB, Threshold: 8192}, "entries"},
		{"small state: fewer entries", SnapshotState{Applied: 8196, LastSnapshot: 5, StateSize: MiB, SinceBytes: MiB, Threshold: 8192}, ""},
		{"large state: entries alone never", SnapshotState{Applied: 1 << 20, LastSnapshot: 5, StateSize: 8 * MiB, SinceBytes: MiB, Threshold: 8192}, ""},
	} {
		due, why := SnapshotDue(c.s)
		if due != (c.want != "") || why != c.want {
			t.Errorf("%s: SnapshotDue = %v %q, want %q", c.name, due, why, c.want)
		}
	}
}
