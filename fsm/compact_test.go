package fsm

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqd/mqd/command"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// fillTopic publishes n messages of size bytes to topic, 16 per batch.
func fillTopic(h *harness, topic string, n, size int) {
	h.t.Helper()
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: topic, Patch: mlog.Patch{Partitions: ptr(uint32(1))}})
	val := strings.Repeat("x", size)
	for i := 0; i < n; i += 16 {
		var msgs []mlog.Placed
		for j := i; j < min(i+16, n); j++ {
			msgs = append(msgs, msg(fmt.Sprintf("%06d%s", j, val)))
		}
		h.must(publish(2, topic, msgs...))
	}
}

// A state whose data was deleted is sparse: the next snapshot's size is its
// live pages, and taking it compacts fsm.db to about that, keeping every
// remaining key; a dense state is left alone and counted whole.
func TestCompactAtSnapshot(t *testing.T) {
	h := mustFSM(t)
	fillTopic(h, "gone", 3000, 8<<10)
	fillTopic(h, "kept", 200, 8<<10)
	size, _ := h.f.spaceStats()
	if h.f.Sparse() || h.f.NextSnapshotSize() != uint64(size) {
		t.Fatalf("dense state: sparse %v, next snapshot %d, want its size %d", h.f.Sparse(), h.f.NextSnapshotSize(), size)
	}
	h.must(&command.Command{Op: command.OpDeleteTopic, Now: 3, Topic: "gone"})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 4, Topic: "other", Patch: mlog.Patch{Partitions: ptr(uint32(1))}})
	want := dumpDB(t, h.f)
	size, free := h.f.spaceStats()
	if !h.f.Sparse() {
		t.Fatalf("after deleting most data: size %d, free %d, not sparse", size, free)
	}
	next := h.f.NextSnapshotSize()
	if next >= uint64(size)/2 {
		t.Fatalf("next snapshot %d of a %d-byte state with %d free", next, size, free)
	}
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap.Release()
	after, _ := h.f.spaceStats()
	st, err := os.Stat(h.f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("state %d bytes (%d free) → %d (file %d); estimated %d", size, free, after, st.Size(), next)
	if after > int64(next)+int64(next)/4+1<<20 || st.Size() > size/2 {
		t.Fatalf("compacted state %d bytes (file %d), estimated %d, was %d", after, st.Size(), next, size)
	}
	if got := dumpDB(t, h.f); !reflect.DeepEqual(got, want) {
		t.Fatalf("compaction changed the state: %d keys, want %d", len(got), len(want))
	}
	if h.f.AppliedIndex() != h.idx {
		t.Fatalf("applied index %d after compaction, want %d", h.f.AppliedIndex(), h.idx)
	}
	if _, err := os.Stat(h.f.path + compactSuffix); !os.IsNotExist(err) {
		t.Fatalf("temporary copy left: %v", err)
	}
	h.must(publish(5, "kept", msg("after")))
}

// BenchmarkSnapshotCompact compares the two ways a snapshot copies a state
// of about 256 MiB (1 KiB messages): "writeto" is bbolt's tx.WriteTo, the
// whole file page by page (what every snapshot did before compact.go);
// "compact" is the compacted copy compact.go writes when the state is
// sparse, here of a dense state, its worst case; "compact-sparse" of the
// same state after three quarters of it were deleted. Each writes a file in
// the test's temporary dir and fsyncs it; ns/op is the wall time, and
// cpu-s/op the process CPU time of one copy.
func BenchmarkSnapshotCompact(b *testing.B) {
	h := mustFSM(b)
	const topics, perTopic = 4, 64 << 10 // 256 Ki messages of 1 KiB
	for i := range topics {
		fillTopic(h, fmt.Sprintf("t%d", i), perTopic, 1<<10)
	}
	dir := b.TempDir()
	copyOnce := func(b *testing.B, compact bool) {
		path := filepath.Join(dir, "copy")
		_ = os.Remove(path)
		if compact {
			if err := writeCompactCopy(h.f.db, path); err != nil {
				b.Fatal(err)
			}
			return
		}
		w, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		if err := h.f.View(func(tx *bolt.Tx) error { _, err := tx.WriteTo(w); return err }); err != nil {
			b.Fatal(err)
		}
		if err := w.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	run := func(name string, compact bool) {
		b.Run(name, func(b *testing.B) {
			size, free := h.f.spaceStats()
			cpu0 := cpuTime()
			for b.Loop() {
				copyOnce(b, compact)
			}
			st, _ := os.Stat(filepath.Join(dir, "copy"))
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(size)/(1<<20), "state-MiB")
			b.ReportMetric(float64(free)/(1<<20), "free-MiB")
			b.ReportMetric(float64(st.Size())/(1<<20), "copy-MiB")
		})
	}
	run("writeto", false)
	run("compact", true)
	for i := 1; i < topics; i++ {
		h.must(&command.Command{Op: command.OpDeleteTopic, Now: 3, Topic: fmt.Sprintf("t%d", i)})
	}
	run("writeto-sparse", false)
	run("compact-sparse", true)
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A closed state answers its next snapshot's size as 0: the disk guard may
// add up a data group's replica that is leaving this node just as it
// closes. bbolt's Info panics on a closed database ("database file isn't
// correctly mapped"), which took a node down in a soak (a drain closed its
// replicas while a probe asked its status).
func TestNextSnapshotSizeOfClosedState(t *testing.T) {
	h := mustFSM(t)
	fillTopic(h, "t", 10, 100)
	if h.f.NextSnapshotSize() == 0 {
		t.Fatal("an open state with messages: next snapshot 0")
	}
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := h.f.NextSnapshotSize(); got != 0 {
		t.Fatalf("closed state: next snapshot %d, want 0", got)
	}
	if h.f.Sparse() {
		t.Fatal("closed state: sparse")
	}
}
