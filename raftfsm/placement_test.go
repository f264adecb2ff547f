package raftfsm

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// Topics spread evenly over one group per voter, each preferring another
// leader; a group is made only when its set has none.
func TestChoosePlacement(t *testing.T) {
	dir := &fsm.Directory{Groups: map[string][]string{}, Topics: map[string]string{}}
	voters := []string{"n3", "n1", "n2"}
	leaders := map[string]int{}
	for i := range 9 {
		id, members, create := choosePlacement(voters, DefaultReplicas, dir)
		if _, had := dir.Groups[id]; had == create {
			t.Fatalf("topic %d: group %s create=%v, but it exists=%v", i, id, create, had)
		}
		if len(members) != 3 {
			t.Fatalf("topic %d: members %v, want 3", i, members)
		}
		dir.Groups[id] = members
		dir.Topics["t"+string(rune('a'+i))] = id
		leaders[members[0]]++
	}
	if len(dir.Groups) != 3 {
		t.Fatalf("groups %v, want one per voter", dir.Groups)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if leaders[n] != 3 {
			t.Fatalf("preferred leaders %v, want 3 topics each", leaders)
		}
	}
	if want := []string{"n2", "n3", "n1"}; !slices.Equal(dir.Groups["g2"], want) {
		t.Fatalf("g2 %v, want %v", dir.Groups["g2"], want)
	}
	// Five voters, three replicas: five sets.
	dir = &fsm.Directory{Groups: map[string][]string{}, Topics: map[string]string{}}
	for i := range 5 {
		id, members, _ := choosePlacement([]string{"a", "b", "c", "d", "e"}, DefaultReplicas, dir)
		dir.Groups[id] = members
		dir.Topics[string(rune('a'+i))] = id
	}
	if len(dir.Groups) != 5 || !slices.Equal(dir.Groups["g5"], []string{"e", "a", "b"}) {
		t.Fatalf("five voters: %v", dir.Groups)
	}
	// Five voters, three topics of three replicas: the replicas spread,
	// so no node holds all three topics (consecutive sets would put the
	// middle voter in every group) and each topic has its own leader.
	dir3 := &fsm.Directory{Groups: map[string][]string{}, Topics: map[string]string{}}
	held, lead := map[string]int{}, map[string]int{}
	for i := range 3 {
		id, members, _ := choosePlacement([]string{"a", "b", "c", "d", "e"}, DefaultReplicas, dir3)
		dir3.Groups[id] = members
		dir3.Topics[string(rune('a'+i))] = id
		for _, m := range members {
			held[m]++
		}
		lead[members[0]]++
	}
	for n, k := range held {
		if k > 2 {
			t.Fatalf("five voters, three topics: %s holds %d (%v), want at most 2", n, k, dir3.Groups)
		}
	}
	if len(lead) != 3 {
		t.Fatalf("five voters, three topics: preferred leaders %v, want three nodes", lead)
	}
	// Replica counts side by side: a topic of 1 or 5 replicas goes to a
	// group of that size, never to one of another.
	one, oneMembers, create := choosePlacement([]string{"a", "b", "c", "d", "e"}, 1, dir)
	if !create || len(oneMembers) != 1 {
		t.Fatalf("replicas 1 beside groups of 3: %s %v create=%v, want a new group of one", one, oneMembers, create)
	}
	dir.Groups[one] = oneMembers
	if _, all, create := choosePlacement([]string{"a", "b", "c", "d", "e"}, 5, dir); !create || len(all) != 5 {
		t.Fatalf("replicas 5: %v create=%v, want a new group of five", all, create)
	}
	// One voter: one group of one.
	id, members, _ := choosePlacement([]string{"solo"}, DefaultReplicas, &fsm.Directory{})
	if id != "g1" || !slices.Equal(members, []string{"solo"}) {
		t.Fatalf("one voter: %s %v", id, members)
	}
}

// A fourth node gets a share of the replicas, and of the preferred
// leaders; a balanced cluster plans nothing.
func TestPlanRebalance(t *testing.T) {
	groups := map[string][]string{
		"g1": {"n1", "n2", "n3"}, "g2": {"n2", "n3", "n1"}, "g3": {"n3", "n1", "n2"},
	}
	voters := []string{"n1", "n2", "n3", "n4"}
	moves := planRebalance(groups, voters)
	load := memberLoad(groups, voters)
	for _, v := range voters {
		if load[v] < 2 || load[v] > 3 {
			t.Fatalf("after %v: loads %v, want 2 or 3 each", moves, load)
		}
	}
	lead := map[string]int{}
	for id, ms := range groups {
		if len(ms) != 3 || len(slices.Compact(slices.Sorted(slices.Values(ms)))) != 3 {
			t.Fatalf("group %s: members %v", id, ms)
		}
		lead[ms[0]]++
	}
	for _, v := range voters {
		if lead[v] > 1 {
			t.Fatalf("preferred leaders %v after %v", lead, moves)
		}
	}
	if again := planRebalance(groups, voters); len(again) != 0 {
		t.Fatalf("a balanced cluster planned %v", again)
	}
}

// Placement needs state format 4. Below it, it does not wait while a
// member's last answer says it reads less (a rolling upgrade: the caller
// creates the topic in the default group); otherwise it waits for the raise
// within the request's deadline; at format 4 it places.
func TestDirectoryFormat(t *testing.T) {
	f, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := &Node{FSM: f, cfg: Config{ID: "n1"}}
	members := []raft.Server{{ID: "n1"}, {ID: "n2"}, {ID: "n3"}}
	now := time.Now()
	n.peers.views = map[string]*peerView{
		"n2": {status: Status{StateFormatMax: 3}, lastOK: now.Add(-time.Minute), failed: true}, // 0.2.0, down since
		"n3": {status: Status{StateFormatMax: fsm.StateFormat}, lastOK: now},
	}
	start := time.Now()
	if ok, err := n.directoryFormat(context.Background(), members); ok || err != nil || time.Since(start) > time.Second {
		t.Fatalf("with a member on 0.2.0: %v, %v after %v; want false, nil at once", ok, err, time.Since(start))
	}
	n.peers.views["n2"] = &peerView{status: Status{StateFormatMax: fsm.StateFormat}, lastOK: now}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if ok, err := n.directoryFormat(ctx, members); ok || !errors.Is(err, fsm.ErrFormatTooOld) {
		t.Fatalf("every member reads format 4, not raised yet, deadline passed: %v, %v; want false, ErrFormatTooOld", ok, err)
	}
	raise := &command.Command{Op: command.OpSetFormat, Now: 1, Format: fsm.DirectoryFormat}
	if r, _ := f.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: raise.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
		t.Fatalf("raise: %+v", r)
	}
	if ok, err := n.directoryFormat(context.Background(), members); !ok || err != nil {
		t.Fatalf("in format 4: %v, %v; want true", ok, err)
	}
}

// A restore leaves each data group one member: once nodes have joined, a
// rebalance grows each back to the members it had (want), on the least
// loaded voters, no further than the voters there are; a group without
// want, or one at it, gets nothing; a grown cluster plans nothing more.
func TestPlanGrowth(t *testing.T) {
	groups := map[string][]string{"g1": {"r1"}, "g2": {"r1"}, "g3": {"r1"}, "g4": {"r1"}, "g5": {"r1"}}
	want := map[string]int{"g1": 3, "g2": 3, "g3": 3, "g5": 5}
	voters := []string{"r1", "r2", "r3"}
	moves := planGrowth(groups, voters, want)
	for _, id := range []string{"g1", "g2", "g3", "g5"} {
		if ms := groups[id]; len(ms) != 3 || ms[0] != "r1" || len(slices.Compact(slices.Sorted(slices.Values(ms)))) != 3 {
			t.Errorf("group %s after %v: members %v, want r1 first and three distinct", id, moves, ms)
		}
	}
	if ms := groups["g4"]; !slices.Equal(ms, []string{"r1"}) {
		t.Errorf("g4 (no want) grew to %v", ms)
	}
	if len(moves) != 8 {
		t.Errorf("moves %v, want 8 additions", moves)
	}
	for _, m := range moves {
		if m.From != "" || m.To == "" {
			t.Errorf("move %+v: an addition has a To and no From", m)
		}
	}
	if again := planGrowth(groups, voters, want); len(again) != 0 {
		t.Errorf("a grown cluster planned %v", again)
	}
	// Where there is a choice, the least loaded voter, ties to the lowest
	// id: r4 (no replica) for g1; then r2 and r3 for g2 (each holding one,
	// as r4 does by then: r2 the lowest, then r3, r2 holding two).
	groups = map[string][]string{"g1": {"r1"}, "g2": {"r1"}, "g3": {"r2", "r3"}}
	moves = planGrowth(groups, []string{"r1", "r2", "r3", "r4"}, map[string]int{"g1": 2, "g2": 3})
	if !slices.Equal(groups["g1"], []string{"r1", "r4"}) || !slices.Equal(groups["g2"], []string{"r1", "r2", "r3"}) {
		t.Errorf("growth on four voters: %v (moves %v); want g1 [r1 r4], g2 [r1 r2 r3]", groups, moves)
	}
}

// A topic placed while the cluster has fewer voters than its replicas goes
// to a group made for that many (Directory.Want), not to the group of the
// same members made for fewer; growGroups' plan then grows it as voters
// join, and a new topic of that count goes to the grown group.
func TestChoosePlacementFewerVoters(t *testing.T) {
	dir := &fsm.Directory{Groups: map[string][]string{}, Topics: map[string]string{}, Want: map[string]int{}}
	place := func(voters []string, r int, topic string) string {
		t.Helper()
		id, members, create := choosePlacement(voters, r, dir)
		if create {
			dir.Groups[id] = members
			if r > 1 {
				dir.Want[id] = r // as applyCreateGroup records OpCreateGroup's Replicas
			}
		}
		dir.Topics[topic] = id
		return id
	}
	one := []string{"n1"}
	g3 := place(one, 3, "a")
	g1 := place(one, 1, "b")
	if g3 == g1 || !slices.Equal(dir.Groups[g3], one) || !slices.Equal(dir.Groups[g1], one) {
		t.Fatalf("one voter, replicas 3 and 1: groups %s and %s of %v, want two groups of n1", g3, g1, dir.Groups)
	}
	if dir.WantOf(g3) != 3 || dir.WantOf(g1) != 1 {
		t.Fatalf("want %d and %d, want 3 and 1", dir.WantOf(g3), dir.WantOf(g1))
	}
	if again := place(one, 3, "c"); again != g3 {
		t.Fatalf("a second topic of 3 replicas went to %s, want %s", again, g3)
	}
	three := []string{"n1", "n2", "n3"}
	moves := planGrowth(dir.Groups, three, dir.Want)
	if len(moves) != 2 || len(dir.Groups[g3]) != 3 || len(dir.Groups[g1]) != 1 {
		t.Fatalf("growth on three voters: moves %v, groups %v; want %s grown to 3 and %s left at 1", moves, dir.Groups, g3, g1)
	}
}
