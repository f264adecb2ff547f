package fsm

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/mqd/mqd/command"
)

// openAt opens the FSM at path and returns a harness continuing at its
// applied index.
func openAt(t *testing.T, path string) *harness {
	t.Helper()
	f, err := OpenFSM(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, f: f, idx: f.AppliedIndex(), notified: map[string]int{}}
}

// crash leaves the file the way a killed process does: committed, not
// fsynced, never closed by the FSM.
func (h *harness) crash() {
	h.f.stopCheckpoints()
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.releasePin()
	h.f.db.Close()
	h.f.state.close()
}

// checkpoint moves the checkpoint to the last commit.
func (h *harness) checkpoint() {
	h.t.Helper()
	h.f.mu.RLock()
	defer h.f.mu.RUnlock()
	if err := h.f.takeCheckpoint(false); err != nil {
		h.t.Fatal(err)
	}
}

func setNode(id string) *command.Command {
	return &command.Command{Op: command.OpSetNode, Node: command.NodeInfo{ID: id, HTTPAddr: "h-" + id, RaftAddr: "r-" + id}}
}

// After a clean close the FSM opens as it was, with its applied index and
// term; after any other stop it opens at its last checkpoint (taken at
// open and at every snapshot) and skips the entries raft replays up to it.
func TestFSMReopens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fsm.db")

	h := openAt(t, path)
	h.must(setNode("n1"))
	h.must(setNode("n2"))
	snap, err := h.f.Snapshot() // a checkpoint at index 2
	if err != nil {
		t.Fatal(err)
	}
	snap.Release()
	h.must(setNode("n3"))
	h.crash()

	h = openAt(t, path)
	if got := h.f.AppliedIndex(); got != 2 {
		t.Fatalf("after a crash: applied index %d, want 2 (the checkpoint)", got)
	}
	if _, term := h.f.storedApplied(); term != 1 {
		t.Fatalf("after a crash: applied term %d, want 1", term)
	}
	if len(h.f.Nodes()) != 2 {
		t.Fatalf("after a crash: nodes %v, want n1 and n2", h.f.Nodes())
	}
	// raft replays from its last snapshot: entries 1..2 are in the file and
	// must not be applied again (a different command at index 2 shows it).
	out := h.f.ApplyBatch([]*raft.Log{
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: setNode("replayed").Encode()},
		{Index: 3, Term: 1, Type: raft.LogCommand, Data: setNode("n3").Encode()},
	})
	if out[0] != nil || out[1] == nil {
		t.Fatalf("replayed batch results %v: want nil for index 2 (skipped), a result for 3", out)
	}
	if n := h.f.Nodes(); len(n) != 3 || n["replayed"].ID != "" {
		t.Fatalf("after replay: nodes %v, want n1..n3 only", n)
	}
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}

	h = openAt(t, path)
	if got := h.f.AppliedIndex(); got != 3 {
		t.Fatalf("after a clean close: applied index %d, want 3", got)
	}
	h.crash() // the checkpoint taken at open: index 3

	h = openAt(t, path)
	defer h.f.Close()
	if got, n := h.f.AppliedIndex(), len(h.f.Nodes()); got != 3 || n != 3 {
		t.Fatalf("after a crash right after open: applied index %d, %d nodes; want 3 and 3", got, n)
	}
}

// The log bytes since the latest snapshot, which decide when the next one
// is due, survive a restart: raft replays the entries after its snapshot,
// and those fsm.db already holds count although they are skipped. Only
// what is applied counts as applied bytes.
func TestBytesSinceSnapshotCountsReplayedEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fsm.db")
	h := openAt(t, path)
	var logs []*raft.Log
	var total uint64
	for i := range 5 {
		l := &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: setNode(string(rune('a' + i))).Encode()}
		logs = append(logs, l)
		total += uint64(len(l.Data))
	}
	h.f.ApplyBatch(logs[:2])
	h.f.ApplyBatch(logs[2:4])
	if got := h.f.BytesSinceSnapshot(); got != total-uint64(len(logs[4].Data)) {
		t.Fatalf("before the restart: %d bytes since the snapshot, want %d", got, total-uint64(len(logs[4].Data)))
	}
	h.checkpoint() // as checkpointLoop does every second
	h.crash()

	// No snapshot: raft replays from index 1, a batch all in the file, one
	// partly, then a new entry.
	h = openAt(t, path)
	defer h.f.Close()
	h.f.ApplyBatch(logs[:2])
	h.f.ApplyBatch(logs[2:5])
	if got := h.f.BytesSinceSnapshot(); got != total {
		t.Fatalf("after the restart and replay: %d bytes since the snapshot, want %d (the whole log)", got, total)
	}
	if got, want := h.f.AppliedBytes(), uint64(len(logs[4].Data)); got != want {
		t.Fatalf("applied bytes %d after the restart, want %d (only index 5 was applied)", got, want)
	}
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap.Release()
	if got := h.f.BytesSinceSnapshot(); got != 0 {
		t.Fatalf("after a snapshot: %d bytes since it, want 0", got)
	}
}
