package replica

import (
	"testing"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
)

// The node sums each group's applied events; dropping the sums of groups
// a view of the state at some index did not hold keeps those that got
// events after that index (a group created since the view was taken).
func TestGroupTalliesDrop(t *testing.T) {
	n := &Group{metrics: newGroupMetrics(DefaultGroup)}
	var idx uint64
	n.metrics.applied = func() uint64 { return idx }
	g1, g2 := fsm.TopicGroup{Topic: "t", Group: "g1"}, fsm.TopicGroup{Topic: "t", Group: "g2"}
	idx = 5
	n.metrics.tally(map[fsm.TopicGroup]*group.Tally{g1: {Nacked: 1}, g2: {Nacked: 2, Replayed: 1}})
	idx = 7
	n.metrics.tally(map[fsm.TopicGroup]*group.Tally{g2: {Nacked: 3, LeasesExpired: 4}})
	got := n.GroupTallies()
	if want := (TallyAt{group.Tally{Nacked: 5, LeasesExpired: 4, Replayed: 1}, 7}); got[g2] != want || got[g1].Nacked != 1 || len(got) != 2 {
		t.Fatalf("GroupTallies = %+v, want g1 nacked 1 and g2 %+v", got, want)
	}
	n.DropGroupTallies([]fsm.TopicGroup{g1, g2}, 6)
	got = n.GroupTallies()
	if _, ok := got[g1]; ok {
		t.Errorf("g1 (last event at 5) kept after a drop up to 6")
	}
	if got[g2].Nacked != 5 {
		t.Errorf("g2 (events at 7) dropped by a drop up to 6: %+v", got)
	}
}
