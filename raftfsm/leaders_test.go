package raftfsm

import (
	"testing"
	"time"
)

// TestLeaderTable: per group, the claim of the highest term wins; a lower
// term is taken only once the higher one is stale; a node that stops
// claiming a group loses it at once; a claim not renewed within probeStale
// is not answered; a status without leads (an older binary) changes
// nothing.
func TestLeaderTable(t *testing.T) {
	var lt leaderTable
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	want := func(step, g, node string, term uint64, now time.Time) {
		t.Helper()
		n, tm, ok := lt.leader(g, now)
		if node == "" {
			if ok {
				t.Fatalf("%s: group %s led by %s (term %d), want unknown", step, g, n, tm)
			}
			return
		}
		if !ok || n != node || tm != term {
			t.Fatalf("%s: group %s led by %q term %d (known %v), want %s term %d", step, g, n, tm, ok, node, term)
		}
	}
	want("empty", "g1", "", 0, t0)

	lt.observe("n1", map[string]uint64{"g1": 5, "g2": 3}, at(0))
	want("first claim", "g1", "n1", 5, at(0))
	want("first claim", "g2", "n1", 3, at(0))

	// n2 answers later with an old claim to g1 (a leader cut off, at a
	// lower term): ignored.
	lt.observe("n2", map[string]uint64{"g1": 4}, at(100*time.Millisecond))
	want("lower term", "g1", "n1", 5, at(100*time.Millisecond))

	// A higher term wins whichever answered first.
	lt.observe("n3", map[string]uint64{"g1": 6}, at(200*time.Millisecond))
	want("higher term", "g1", "n3", 6, at(200*time.Millisecond))
	// n1's next answer still claims term 5 (it has not heard of term 6):
	// it does not take g1 back.
	lt.observe("n1", map[string]uint64{"g1": 5, "g2": 3}, at(300*time.Millisecond))
	want("older leader again", "g1", "n3", 6, at(300*time.Millisecond))

	// A node that no longer claims a group loses it at once.
	lt.observe("n1", map[string]uint64{"g1": 5}, at(400*time.Millisecond))
	want("stepped down", "g2", "", 0, at(400*time.Millisecond))

	// A status without leads (an older binary, or a node that leads
	// nothing) is no source, and takes nothing from the others.
	lt.observe("n4", nil, at(450*time.Millisecond))
	want("no leads", "g1", "n3", 6, at(450*time.Millisecond))

	// Renewed by the same node at the same term: stays known past
	// probeStale from its first claim.
	renew := at(200*time.Millisecond + probeStale - 10*time.Millisecond)
	lt.observe("n3", map[string]uint64{"g1": 6}, renew)
	want("renewed", "g1", "n3", 6, at(200*time.Millisecond+probeStale))

	// Not renewed within probeStale (n3 stopped answering): unknown.
	want("stale", "g1", "", 0, renew.Add(probeStale))
	// Then a lower term's claim is taken: nothing fresher says otherwise.
	lt.observe("n1", map[string]uint64{"g1": 5}, renew.Add(probeStale))
	want("lower term after stale", "g1", "n1", 5, renew.Add(probeStale))

	// An equal term from another node (raft elects one leader per term:
	// only a confused answer) does not replace the claim held.
	lt.observe("n2", map[string]uint64{"g1": 5}, renew.Add(probeStale+time.Millisecond))
	want("equal term", "g1", "n1", 5, renew.Add(probeStale+time.Millisecond))
}
