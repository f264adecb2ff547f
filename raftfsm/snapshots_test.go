package raftfsm

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
		if got := trailingKeep(c.trailing, c.size, c.sinceBytes, c.sinceN); got != c.want {
			t.Errorf("%s: trailingKeep(%d, %d, %d, %d) = %d, want %d", c.name, c.trailing, c.size, c.sinceBytes, c.sinceN, got, c.want)
		}
	}
}
