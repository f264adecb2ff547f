package fsm

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/mqd/mqd/command"
	bolt "go.etcd.io/bbolt"
)

func TestDirectory(t *testing.T) {
	h := mustFSM(t)
	calls := 0
	h.f.OnDirectory(func() { calls++ })
	create := &command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n2", "n3", "n1"}}
	place := &command.Command{Op: command.OpPlaceTopic, Now: 1, Topic: "orders", Group: "g1"}

	// Before format 4 both are refused and write nothing.
	before := dumpDB(t, h.f)
	for _, c := range []*command.Command{create, place} {
		if r := h.apply(c); !errors.Is(r.Err, ErrFormatTooOld) {
			t.Fatalf("%s in format 1: %v, want ErrFormatTooOld", c.Op, r.Err)
		}
	}
	if after := dumpDB(t, h.f); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused directory commands wrote:\n%s", diffDumps(before, after))
	}

	h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: DirectoryFormat})
	if r := h.apply(place); !errors.Is(r.Err, ErrGroupUnknown) {
		t.Fatalf("place in an unknown group: %v, want ErrGroupUnknown", r.Err)
	}
	h.must(create)
	h.must(create) // again, same members: nothing changes
	if r := h.apply(&command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n1"}}); !errors.Is(r.Err, ErrGroupMembers) {
		t.Fatalf("g1 again with other members: %v, want ErrGroupMembers", r.Err)
	}
	if r := h.apply(&command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g2"}); !errors.Is(r.Err, ErrGroupMembers) {
		t.Fatalf("a group without members: %v, want ErrGroupMembers", r.Err)
	}
	if r := h.must(place); r.Group != "g1" || !r.Created {
		t.Fatalf("place: %+v", r)
	}
	h.must(&command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g2", Members: []string{"n1"}})
	// A topic never moves: placing it again answers where it is.
	if r := h.must(&command.Command{Op: command.OpPlaceTopic, Now: 1, Topic: "orders", Group: "g2"}); r.Group != "g1" || r.Created {
		t.Fatalf("place again elsewhere: %+v, want g1, not created", r)
	}
	// A move sets the members and marks the group moved.
	if r := h.apply(&command.Command{Op: command.OpSetMembers, Now: 1, Group: "g9", Members: []string{"n1"}}); !errors.Is(r.Err, ErrGroupUnknown) {
		t.Fatalf("set members of an unknown group: %v, want ErrGroupUnknown", r.Err)
	}
	if r := h.apply(&command.Command{Op: command.OpSetMembers, Now: 1, Group: "g2"}); !errors.Is(r.Err, ErrGroupMembers) {
		t.Fatalf("set no members: %v, want ErrGroupMembers", r.Err)
	}
	h.must(&command.Command{Op: command.OpSetMembers, Now: 1, Group: "g2", Members: []string{"n1"}}) // the same: nothing changes
	if h.f.Directory().Moved["g2"] {
		t.Fatal("g2 moved by setting the members it had")
	}
	h.must(&command.Command{Op: command.OpSetMembers, Now: 1, Group: "g2", Members: []string{"n4"}})
	if calls != 4 {
		t.Fatalf("OnDirectory called %d times, want 4 (g1, orders, g2, g2's move)", calls)
	}
	d := h.f.Directory()
	want := &Directory{Groups: map[string][]string{"g1": {"n2", "n3", "n1"}, "g2": {"n4"}}, Moved: map[string]bool{"g2": true},
		Topics: map[string]string{"orders": "g1"}, Want: map[string]int{}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("directory %+v, want %+v", d, want)
	}
	if d.GroupOf("orders") != "g1" || d.GroupOf("other") != "" {
		t.Fatalf("GroupOf: %q %q", d.GroupOf("orders"), d.GroupOf("other"))
	}
	if c := d.Counts(); c["g1"] != 1 || c["g2"] != 0 {
		t.Fatalf("counts %v", c)
	}

	// A snapshot carries the directory; the restore tells OnDirectory.
	dst := mustFSM(t)
	dcalls := 0
	dst.f.OnDirectory(func() { dcalls++ })
	h.restoreInto(dst)
	if got := dst.f.Directory(); !reflect.DeepEqual(got, want) || dcalls != 1 {
		t.Fatalf("restored directory %+v (%d calls), want %+v", got, dcalls, want)
	}
}

// Two creations of one name racing with the raise to format 4, one sent
// to the default group before it and one placed after it: whichever
// commits first keeps the topic. A topic the default group holds is not
// placed (the placement answers the default group), and the default group
// refuses to create a topic placed meanwhile (ErrTopicPlaced, writing
// nothing), so no name lives in two groups.
func TestPlaceRacesDefaultCreation(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "early"})
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: DirectoryFormat})
	h.must(&command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n1"}})
	if r := h.must(&command.Command{Op: command.OpPlaceTopic, Now: 1, Topic: "early", Group: "g1"}); r.Group != "" || r.Created {
		t.Fatalf("placing a topic of the default group: %+v, want the default group", r)
	}
	if g := h.f.Directory().GroupOf("early"); g != "" {
		t.Fatalf("early placed in %q", g)
	}
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "early"}) // an update still applies

	h.must(&command.Command{Op: command.OpPlaceTopic, Now: 1, Topic: "late", Group: "g1"})
	before := dumpDB(t, h.f)
	if r := h.apply(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "late"}); !errors.Is(r.Err, ErrTopicPlaced) {
		t.Fatalf("creating a placed topic in the default group: %v, want ErrTopicPlaced", r.Err)
	}
	if after := dumpDB(t, h.f); !reflect.DeepEqual(before, after) {
		t.Fatalf("the refused creation wrote:\n%s", diffDumps(before, after))
	}
}

// TestRestoreDirectory: a restore's directory names the restored node the
// one member of each restored group (a group that never moved), records
// the count a group had when more than one, drops a group the archive
// lacks with its placements, and places each restored group's topics
// where its own state holds them, including one the metadata copy did not
// place yet.
func TestRestoreDirectory(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: DirectoryFormat})
	for _, c := range []*command.Command{
		{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n1", "n2", "n3"}},
		{Op: command.OpCreateGroup, Now: 1, Group: "g2", Members: []string{"n2"}},
		{Op: command.OpCreateGroup, Now: 1, Group: "g3", Members: []string{"n3", "n1", "n2"}},
		{Op: command.OpPlaceTopic, Now: 1, Topic: "a", Group: "g1"},
		{Op: command.OpPlaceTopic, Now: 1, Topic: "b", Group: "g2"},
		{Op: command.OpPlaceTopic, Now: 1, Topic: "gone", Group: "g3"},
		{Op: command.OpSetMembers, Now: 1, Group: "g1", Members: []string{"n2", "n3", "n4"}},
	} {
		h.must(c)
	}
	path := filepath.Join(t.TempDir(), "meta.db")
	b, err := h.f.Backup(t.TempDir(), func(int64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer b.File.Close()
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, b.File); err != nil || w.Close() != nil {
		t.Fatal(err)
	}
	groups := map[string]RestoredGroup{"g1": {Topics: []string{"a", "late"}, Want: 3}, "g2": {Topics: []string{"b"}, Want: 1}}
	if err := RestoreDirectory(path, "r1", groups); err != nil {
		t.Fatal(err)
	}
	// The file as a restore installs it (a snapshot), read as it is.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := &FSM{db: db}
	want := &Directory{Groups: map[string][]string{"g1": {"r1"}, "g2": {"r1"}}, Moved: map[string]bool{},
		Topics: map[string]string{"a": "g1", "late": "g1", "b": "g2"}, Want: map[string]int{"g1": 3}}
	if d := f.Directory(); !reflect.DeepEqual(d, want) {
		t.Fatalf("restored directory %+v, want %+v", d, want)
	}
	// A state without a directory (a data group's) is not a metadata state.
	if err := RestoreDirectory(filepath.Join(t.TempDir(), "none.db"), "r1", groups); err == nil {
		t.Error("RestoreDirectory of a file without a directory succeeded")
	}
}

// TestRestoreDirectoryTopicInTwoGroups: a topic the states of two restored
// groups hold stays in the group the directory placed it in, when that
// group holds it, and otherwise goes to the lowest id; the same on every
// run (RestoreDirectory once ranged over a map).
func TestRestoreDirectoryTopicInTwoGroups(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: DirectoryFormat})
	for _, c := range []*command.Command{
		{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n1"}},
		{Op: command.OpCreateGroup, Now: 1, Group: "g2", Members: []string{"n2"}},
		{Op: command.OpCreateGroup, Now: 1, Group: "g3", Members: []string{"n3"}},
		{Op: command.OpPlaceTopic, Now: 1, Topic: "x", Group: "g2"},
		{Op: command.OpPlaceTopic, Now: 1, Topic: "z", Group: "g3"},
	} {
		h.must(c)
	}
	b, err := h.f.Backup(t.TempDir(), func(int64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	state, err := io.ReadAll(b.File)
	b.File.Close()
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]RestoredGroup{"g1": {Topics: []string{"x", "y", "z"}}, "g2": {Topics: []string{"x", "y"}},
		"g3": {Topics: []string{"y"}}}
	want := map[string]string{"x": "g2", "y": "g1", "z": "g1"}
	for range 20 {
		path := filepath.Join(t.TempDir(), "meta.db")
		if err := os.WriteFile(path, state, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := RestoreDirectory(path, "r1", groups); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		got := (&FSM{db: db}).Directory().Topics
		db.Close()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("restored placements %v, want %v", got, want)
		}
	}
}
