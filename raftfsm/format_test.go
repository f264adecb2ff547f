package raftfsm

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

func storedFormatOf(t *testing.T, f *FSM) (v int) {
	t.Helper()
	_ = f.View(func(tx *bolt.Tx) error {
		v = storedFormat(tx)
		return nil
	})
	return v
}

// OpSetFormat raises the state's format in the state itself: it survives
// a reopen and travels in snapshots, is never lowered, and a restore
// brings the restored state's format (an older one included).
func TestSetFormatPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fsm.db")
	f, err := OpenFSM(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, notified: map[string]int{}}
	old := mustFSM(t) // a state from before formats
	old.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	if got := h.f.StateFormat(); got != 1 {
		t.Fatalf("a new state is in format %d, want 1", got)
	}
	h.must(&command.Command{Op: command.OpSetFormat, Format: 2})
	if got, stored := h.f.StateFormat(), storedFormatOf(t, h.f); got != 2 || stored != 2 {
		t.Fatalf("after OpSetFormat 2: StateFormat %d, stored %d", got, stored)
	}
	h.must(&command.Command{Op: command.OpSetFormat, Format: 1})
	if got, stored := h.f.StateFormat(), storedFormatOf(t, h.f); got != 2 || stored != 2 {
		t.Fatalf("OpSetFormat 1 lowered the format: StateFormat %d, stored %d", got, stored)
	}

	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err = OpenFSM(path, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h.f = f
	if got := h.f.StateFormat(); got != 2 {
		t.Fatalf("reopened: StateFormat %d, want 2", got)
	}

	fresh := mustFSM(t)
	h.restoreInto(fresh)
	if got := fresh.f.StateFormat(); got != 2 {
		t.Fatalf("restored from a format-2 snapshot: StateFormat %d, want 2", got)
	}
	old.restoreInto(fresh)
	if got := fresh.f.StateFormat(); got != 1 {
		t.Fatalf("restored from a format-1 snapshot: StateFormat %d, want 1", got)
	}
}

// A committed format above what this binary reads stops the node (the
// batch leaves nothing behind); a file in such a format does not open.
func TestNewerFormatStops(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.mustStopWritingNothing("OpSetFormat above StateFormat", func() {
		h.batch(&command.Command{Op: command.OpSetFormat, Format: 1}, &command.Command{Op: command.OpSetFormat, Format: StateFormat + 1})
	})
	if got := h.f.StateFormat(); got != 1 {
		t.Fatalf("StateFormat %d after the refused batch", got)
	}

	path := filepath.Join(t.TempDir(), "fsm.db")
	f, err := OpenFSM(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = f.db.Update(func(tx *bolt.Tx) error {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], StateFormat+1)
		return tx.Bucket(bktMeta).Put(keyFormat, v[:])
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err = OpenFSM(path, slog.New(slog.DiscardHandler)); !errors.Is(err, errFormatTooNew) {
		if err == nil {
			f.Close()
		}
		t.Fatalf("opening a state in format %d: err %v, want errFormatTooNew", StateFormat+1, err)
	}
}

// Leases use range records from the first command after the raise, in
// the same batch too, and after a reopen; not before, nor after a restore
// of an older state.
func TestLeaseSpansFollowFormat(t *testing.T) {
	var spans int
	orig := useSpans
	useSpans = func(g *group.Group) { spans++; orig(g) }
	t.Cleanup(func() { useSpans = orig })
	old := mustFSM(t)
	old.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.must(publish(1, "t", msg("a"), msg("b"), msg("c"), msg("d")))
	lease := &command.Command{Op: command.OpLease, Now: 2, Topic: "t", Group: "g", Max: 1, LeaseMs: 1000}
	h.must(lease)
	if spans != 0 {
		t.Fatalf("a lease in format 1 used range records")
	}
	h.batch(lease, &command.Command{Op: command.OpSetFormat, Format: 2}, lease)
	if spans != 1 {
		t.Fatalf("lease, raise, lease in one batch: %d leases used range records, want 1 (the second)", spans)
	}
	h.must(lease)
	if spans != 2 {
		t.Fatalf("a lease after the raise did not use range records")
	}
	old.restoreInto(h)
	h.must(publish(3, "t", msg("e")))
	h.must(lease)
	if spans != 2 {
		t.Fatalf("a lease after restoring a format-1 state used range records")
	}
}

// The leader raises the format only when every other member answered its
// probe lately and reads the new format.
func TestFormatRaise(t *testing.T) {
	members := []raft.Server{
		{ID: "n1", Suffrage: raft.Voter}, {ID: "n2", Suffrage: raft.Voter}, {ID: "n3", Suffrage: raft.Nonvoter},
	}
	good := formatProbe{max: 2, fresh: true}
	for _, c := range []struct {
		name    string
		cur     int
		members []raft.Server
		probes  map[string]formatProbe
		want    bool
	}{
		{"all good", 1, members, map[string]formatProbe{"n2": good, "n3": good}, true},
		{"single node", 1, members[:1], nil, true},
		{"already raised", 2, members, map[string]formatProbe{"n2": good, "n3": good}, false},
		{"member never probed", 1, members, map[string]formatProbe{"n2": good}, false},
		{"stale probe", 1, members, map[string]formatProbe{"n2": good, "n3": {max: 2}}, false},
		{"old binary answers 0", 1, members, map[string]formatProbe{"n2": {max: 0, fresh: true}, "n3": good}, false},
		{"non-voter on an old binary", 1, members, map[string]formatProbe{"n2": good, "n3": {max: 1, fresh: true}}, false},
		{"probes of non-members do not count", 1, members, map[string]formatProbe{"n2": good, "n4": good}, false},
	} {
		if got := formatRaise(c.cur, 2, "n1", c.members, c.probes); got != c.want {
			t.Errorf("%s: formatRaise = %v, want %v", c.name, got, c.want)
		}
	}
}

// A probe answer counts while it is fresh and the latest probe succeeded;
// a member's binary from before formats reports 0.
func TestFormatProbes(t *testing.T) {
	now := time.Now()
	n := &Node{}
	n.peers.views = map[string]*peerView{
		"fresh":  {status: Status{StateFormatMax: 2}, lastOK: now.Add(-probeEvery)},
		"stale":  {status: Status{StateFormatMax: 2}, lastOK: now.Add(-probeStale - time.Millisecond)},
		"failed": {status: Status{StateFormatMax: 2}, lastOK: now, failed: true},
		"old":    {status: Status{}, lastOK: now},
		"never":  {failed: true},
	}
	want := map[string]formatProbe{"fresh": {2, true}, "stale": {2, false}, "failed": {2, false},
		"old": {0, true}, "never": {0, false}}
	got := n.formatProbes(now)
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %+v, want %+v", id, got[id], w)
		}
	}
}

// After the raise, the leader names the members whose binary reads less
// than the state's format (an older binary on a member's data dir); in
// format 1 nobody lags, whatever it reports.
func TestFormatLagging(t *testing.T) {
	members := []raft.Server{{ID: "n1"}, {ID: "n2"}, {ID: "n3", Suffrage: raft.Nonvoter}, {ID: "n4"}}
	probes := map[string]formatProbe{
		"n1": {max: 0, fresh: true}, // self: never named
		"n2": {max: 2, fresh: true},
		"n3": {max: 0, fresh: true}, // an older binary
		"n4": {max: 0, fresh: false},
		"n5": {max: 0, fresh: true}, // not a member
	}
	if got := formatLagging(2, "n1", members, probes); !slices.Equal(got, []string{"n3"}) {
		t.Errorf("format 2: lagging %v, want [n3]", got)
	}
	if got := formatLagging(1, "n1", members, probes); len(got) != 0 {
		t.Errorf("format 1: lagging %v, want none", got)
	}
}

// A node joins a cluster in format 1 whatever it runs; in format 2 only
// if its status answers, as itself, that it reads format 2.
func TestJoinFormatCheck(t *testing.T) {
	info := command.NodeInfo{ID: "n4", HTTPAddr: "127.0.0.1:7004"}
	for _, c := range []struct {
		name string
		cur  int
		st   Status
		err  error
		want string // "" allowed, else a part of the refusal's message
	}{
		{"format 1, older binary", 1, Status{NodeInfo: info}, nil, ""},
		{"format 1, no answer", 1, Status{}, errors.New("connection refused"), ""},
		{"format 2, reads 2", 2, Status{NodeInfo: info, StateFormatMax: 2}, nil, ""},
		{"format 2, older binary", 2, Status{NodeInfo: info}, nil, "reads state formats up to 0"},
		{"format 2, no answer", 2, Status{}, errors.New("connection refused"), "did not say"},
		{"format 2, another node answers", 2, Status{NodeInfo: command.NodeInfo{ID: "n9"}, StateFormatMax: 2}, nil, "answers as"},
	} {
		err := joinFormatCheck(c.cur, info, c.st, c.err)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (!errors.Is(err, ErrFormatUnsupported) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want ErrFormatUnsupported saying %q", c.name, err, c.want)
		}
	}
}

func TestJoinIDCheck(t *testing.T) {
	servers := []raft.Server{{ID: "n1", Address: "h1:7071"}, {ID: "n2", Address: "h2:7071"}}
	live := map[string]string{"n1": "h1:7071"} // n2 does not answer
	liveFn := func(id string) (string, bool) { a, ok := live[id]; return a, ok }
	cases := []struct {
		name string
		info command.NodeInfo
		want error
	}{
		{"a new id", command.NodeInfo{ID: "n3", RaftAddr: "h3:7071"}, nil},
		{"a member rejoining at its address", command.NodeInfo{ID: "n1", RaftAddr: "h1:7071"}, nil},
		{"another node under a live member's id", command.NodeInfo{ID: "n1", RaftAddr: "h9:7071"}, ErrNodeIDInUse},
		{"a member that does not answer, re-addressed", command.NodeInfo{ID: "n2", RaftAddr: "h8:7071"}, nil},
	}
	for _, c := range cases {
		if err := joinIDCheck(servers, c.info, liveFn); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// The member itself, restarted on a new address: its answer names it.
	live["n1"] = "h7:7071"
	if err := joinIDCheck(servers, command.NodeInfo{ID: "n1", RaftAddr: "h7:7071"}, liveFn); err != nil {
		t.Errorf("member re-addressed and answering from its new address: %v", err)
	}
}

func TestRemoveCheck(t *testing.T) {
	one := []raft.Server{{ID: "solo", Suffrage: raft.Voter}}
	two := []raft.Server{{ID: "a", Suffrage: raft.Voter}, {ID: "b", Suffrage: raft.Nonvoter}}
	cases := []struct {
		servers []raft.Server
		id      string
		want    error
	}{
		{one, "solo", ErrLastVoter},
		{one, "other", ErrNodeNotFound},
		{two, "a", ErrLastVoter},
		{two, "b", nil},
		{append(two, raft.Server{ID: "c", Suffrage: raft.Voter}), "a", nil},
	}
	for _, c := range cases {
		if err := removeCheck(c.servers, c.id); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("remove %s from %v: %v, want %v", c.id, c.servers, err, c.want)
		}
	}
}

// A repeat over a max_message_bytes lowered since its original is a
// duplicate from state format 2; in format 1 the size is checked first,
// as binaries before format 2 do, so that replicas of both agree: a batch
// holding such a repeat and a new message is refused whole in format 1,
// and stores the new message in format 2.
func TestRepeatOverLoweredMaxByFormat(t *testing.T) {
	for _, format := range []int{1, 2} {
		h := mustFSM(t)
		if format > 1 {
			h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: uint32(format)})
		}
		h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t", Patch: mlog.Patch{MaxMessageBytes: ptr(int64(5))}})
		first := h.must(&command.Command{Op: command.OpPublish, Now: 2, Topic: "t", Msgs: []mlog.Placed{keyed(0, "K", "abcd")}}).Published[0]
		h.must(&command.Command{Op: command.OpPutTopic, Now: 3, Topic: "t", Patch: mlog.Patch{MaxMessageBytes: ptr(int64(2))}})
		r := h.apply(&command.Command{Op: command.OpPublish, Now: 4, Topic: "t", Msgs: []mlog.Placed{keyed(0, "K", "abcd"), keyed(0, "N", "ab")}})
		switch {
		case format == 1 && !errors.Is(r.Err, mlog.ErrTooLarge):
			t.Errorf("format 1: %+v %v, want message_too_large", r.Published, r.Err)
		case format == 2 && (r.Err != nil || len(r.Published) != 2 || !r.Published[0].Duplicate || r.Published[0].Offset != first.Offset || r.Published[1].Duplicate):
			t.Errorf("format 2: %+v %v, want the repeat a duplicate of %+v and the new message stored", r.Published, r.Err, first)
		}
		if r := h.apply(&command.Command{Op: command.OpPublish, Now: 5, Topic: "t", Msgs: []mlog.Placed{keyed(0, "M", "abcd")}}); !errors.Is(r.Err, mlog.ErrTooLarge) {
			t.Errorf("format %d: a new message over the max: %v, want message_too_large", format, r.Err)
		}
	}
}

// From state format 2 a lease stops once its messages' records hold
// LeaseMaxBytes (the first whatever its size); in format 1 it leases up to
// Max, as binaries before format 2 do, so that replicas of both agree.
func TestLeaseMaxBytesByFormat(t *testing.T) {
	big := strings.Repeat("x", LeaseMaxBytes/2+1)
	for _, format := range []int{1, 2} {
		h := mustFSM(t)
		if format > 1 {
			h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: uint32(format)})
		}
		h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t", Patch: mlog.Patch{MaxMessageBytes: ptr(int64(16 << 20))}})
		h.must(&command.Command{Op: command.OpPublish, Now: 2, Topic: "t", Msgs: []mlog.Placed{msg(big), msg(big), msg(big)}})
		want := map[int]int{1: 3, 2: 2}[format]
		if r := h.must(&command.Command{Op: command.OpLease, Now: 3, Topic: "t", Group: "g", Max: 10, LeaseMs: 30000}); len(r.Deliveries) != want {
			t.Errorf("format %d: a lease of three %d-byte messages took %d, want %d", format, len(big), len(r.Deliveries), want)
		}
	}
}
