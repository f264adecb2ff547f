package replica

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// lostHarness is a node's FSM (at index 5, term 2), log store (raft's
// in-memory one, holding 1 to 3), snapshot store and lost-entries guard,
// without raft: what checkLostAtOpen and guardedLog read and write.
func lostHarness(t *testing.T) (*Group, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := fsm.OpenFSM(filepath.Join(dir, "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var logs []*raft.Log
	for i := uint64(1); i <= 5; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand,
			Data: (&command.Command{Op: command.OpSetNode, Node: command.NodeInfo{ID: "n1", HTTPAddr: "a", RaftAddr: "b"}}).Encode()})
	}
	f.ApplyBatch(logs)
	store := raft.NewInmemStore()
	if err := store.StoreLogs(logs[:3]); err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStore(filepath.Join(dir, "snapshots"), 2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := newLostGuard(dir, newGroupMetrics(DefaultGroup).lostFound, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	gr := &Group{fsm: f, snaps: snaps, lost: lost, logger: slog.New(slog.DiscardHandler),
		stores: &Stores{Log: store}}
	return gr, dir
}

// TestLostEntriesRecordedAtOpen: a state applied past the log's end (5 >
// 3) restricts the node, durably: a guard opened again on the data dir
// (a restart before catching up) is still restricted; lifting deletes the
// record.
func TestLostEntriesRecordedAtOpen(t *testing.T) {
	gr, dir := lostHarness(t)
	idx, term := gr.fsm.AppliedIndexTerm()
	if err := gr.checkLostAtOpen(idx, term, gr.snaps); err != nil {
		t.Fatal(err)
	}
	if !gr.lost.restricted() || gr.lost.index() != 5 || !strings.Contains(gr.lost.reason(), "entries 4 to 5 are gone") {
		t.Fatalf("restricted %v index %d reason %q", gr.lost.restricted(), gr.lost.index(), gr.lost.reason())
	}
	again, err := newLostGuard(dir, newGroupMetrics(DefaultGroup).lostFound, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if !again.restricted() || again.index() != 5 || again.mark.Term != 2 {
		t.Fatalf("after a restart: restricted %v index %d", again.restricted(), again.index())
	}
	if err := again.lift("test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, lostFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record still there after lift: %v", err)
	}
	if again.restricted() || again.reason() != "" {
		t.Fatal("still restricted after lift")
	}
}

// TestLostEntriesNotAtOpenWhenLogHoldsThem: a log holding the applied
// index restricts nothing.
func TestLostEntriesNotAtOpenWhenLogHoldsThem(t *testing.T) {
	gr, _ := lostHarness(t)
	if err := gr.checkLostAtOpen(3, 2, gr.snaps); err != nil {
		t.Fatal(err)
	}
	if gr.lost.restricted() {
		t.Fatalf("restricted: %s", gr.lost.reason())
	}
}

// TestGuardedLogRefusesClearingApplied: raft clearing a suffix from an
// index the state applied (3 ≤ 5) is refused, the log keeps its entries
// and the node is restricted for good; clearing entries past the applied
// index is done.
func TestGuardedLogRefusesClearingApplied(t *testing.T) {
	gr, dir := lostHarness(t)
	gl := guardedLog{LogStore: gr.stores.Log, g: gr}
	if err := gl.StoreLogs([]*raft.Log{{Index: 4, Term: 2}, {Index: 5, Term: 2}, {Index: 6, Term: 2}, {Index: 7, Term: 2}}); err != nil {
		t.Fatalf("storing the applied entries at their own term: %v", err)
	}
	if gr.lost.restricted() {
		t.Fatal("restricted by matching entries")
	}
	if err := gl.DeleteRange(6, 7); err != nil {
		t.Fatalf("clearing unapplied entries: %v", err)
	}
	err := gl.DeleteRange(3, 5)
	if !errors.Is(err, errLostEntries) {
		t.Fatalf("clearing applied entries: %v, want errLostEntries", err)
	}
	if last, _ := gl.LastIndex(); last != 5 {
		t.Fatalf("last index %d after the refused clear, want 5", last)
	}
	if !gr.lost.restricted() || !strings.Contains(gr.lost.reason(), "for good") {
		t.Fatalf("restricted %v: %q", gr.lost.restricted(), gr.lost.reason())
	}
	b, err := os.ReadFile(filepath.Join(dir, lostFile))
	if err != nil || !strings.Contains(string(b), `"diverged":true`) {
		t.Fatalf("record %q: %v", b, err)
	}
}

// TestGuardedLogRefusesOtherTermAtApplied: a leader sending, at the index
// the state applied, an entry of another term is refused (the state holds
// another history); entries below it pass (they are checked by that one).
func TestGuardedLogRefusesOtherTermAtApplied(t *testing.T) {
	gr, _ := lostHarness(t)
	gl := guardedLog{LogStore: gr.stores.Log, g: gr}
	err := gl.StoreLogs([]*raft.Log{{Index: 4, Term: 3}, {Index: 5, Term: 3}})
	if !errors.Is(err, errLostEntries) {
		t.Fatalf("storing term 3 at the applied index 5 (applied at term 2): %v", err)
	}
	if last, _ := gl.LastIndex(); last != 3 {
		t.Fatalf("last index %d, want 3 (nothing stored)", last)
	}
	if !gr.lost.restricted() {
		t.Fatal("not restricted")
	}
}

// TestGuardedLogAllowsCompaction: deleting entries a snapshot covers (the
// log's head, after a snapshot) is not refused, though they are applied.
func TestGuardedLogAllowsCompaction(t *testing.T) {
	gr, _ := lostHarness(t)
	sink, err := gr.snaps.Create(raft.SnapshotVersionMax, 3, 2, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.Write([]byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	gl := guardedLog{LogStore: gr.stores.Log, g: gr}
	if err := gl.DeleteRange(1, 3); err != nil {
		t.Fatalf("compaction: %v", err)
	}
	if gr.lost.restricted() {
		t.Fatalf("restricted by compaction: %s", gr.lost.reason())
	}
}
