package fsm

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

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
