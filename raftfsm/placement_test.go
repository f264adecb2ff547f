package raftfsm

import (
	"slices"
	"testing"

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
