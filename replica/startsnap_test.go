package replica

import (
	"io"
	"testing"

	"github.com/hashicorp/raft"
)

// The state's start point is listed only while offered (inside NewRaft),
// and is never opened as a snapshot of its own: opening it opens the
// latest real snapshot, or fails when there is none.
func TestStartPointListedOnlyWhileOffered(t *testing.T) {
	inner := raft.NewInmemSnapshotStore()
	s := &stateSnapshots{SnapshotStore: inner, point: &startPoint{meta: raft.SnapshotMeta{ID: "mqd-state-9", Index: 9, Term: 2}}}
	s.offering.Store(true)
	if _, _, err := s.Open("mqd-state-9"); err == nil {
		t.Fatal("opening the start point without a real snapshot succeeded")
	}
	sink, err := inner.Create(raft.SnapshotVersionMax, 5, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state at 5")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != "mqd-state-9" || list[1].Index != 5 {
		t.Fatalf("offered: List = %v %v, want the start point, then the snapshot at 5", list, err)
	}
	meta, rc, err := s.Open("mqd-state-9")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if meta.Index != 5 || string(b) != "state at 5" {
		t.Fatalf("opening the start point gave index %d %q, want the real snapshot at 5", meta.Index, b)
	}
	s.offering.Store(false)
	if list, err := s.List(); err != nil || len(list) != 1 || list[0].Index != 5 {
		t.Fatalf("after NewRaft: List = %v %v, want the real snapshot only", list, err)
	}
}
