package fsm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

func (h *harness) trace(key string, now int64) (*KeyTrace, error) {
	var t *KeyTrace
	err := h.f.Read(func(r *Reader) error {
		var err error
		t, err = r.TraceKey("t", key, now)
		return err
	})
	return t, err
}

// A key's trace from the indexes: duplicates counted (stored ones and
// repeats within a batch) from state format 3 only; a message whose key
// the group processed through an earlier message is skipped; an acked one
// keeps its deliveries and failures.
func TestTraceKey(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Now: 0, Topic: "t", Patch: mlog.Patch{DedupWindowMs: ptr(int64(1000))}})
	h.must(publish(1, "t", keyed(0, "k", "a"), keyed(0, "k", "dup")))
	if tr, err := h.trace("k", 2); err != nil || tr.Duplicates != 0 {
		t.Fatalf("format 1: %+v %v, want no duplicates counted", tr, err)
	}
	h.must(&command.Command{Op: command.OpSetFormat, Now: 2, Format: StateFormat})
	h.must(publish(3, "t", keyed(0, "k", "dup"), keyed(0, "k", "dup")))
	r := h.must(&command.Command{Op: command.OpLease, Now: 4, Topic: "t", Group: "g", Max: 1, LeaseMs: 100})
	h.must(&command.Command{Op: command.OpNack, Now: 5, Topic: "t", Group: "g", Receipts: receipts(r.Deliveries), Reason: "boom", Retryable: true, DelayMs: 0})
	r = h.must(&command.Command{Op: command.OpLease, Now: 6, Topic: "t", Group: "g", Max: 1, LeaseMs: 100})
	h.must(&command.Command{Op: command.OpAck, Now: 7, Topic: "t", Group: "g", Receipts: receipts(r.Deliveries)})
	tr, err := h.trace("k", 8)
	if err != nil || tr.Partition != 0 || tr.Offset != 0 || tr.PublishedAt != 1 || tr.Duplicates != 2 {
		t.Fatalf("trace: %+v %v", tr, err)
	}
	g := tr.Groups["g"]
	if g.State != group.KeyAcked || g.Deliveries != 2 || len(g.History) != 1 || g.History[0].Reason != "boom" {
		t.Fatalf("group g: %+v, want acked after 2 deliveries with the nack's history", g)
	}
	// The publish window passes, k is published again: g processed k
	// within its own window (from the ack), so the new message is skipped.
	h.must(&command.Command{Op: command.OpDedupExpire, Now: 1002, Max: 100})
	h.must(publish(1003, "t", keyed(0, "k", "again")))
	h.must(&command.Command{Op: command.OpLease, Now: 1004, Topic: "t", Group: "g", Max: 1, LeaseMs: 100})
	if tr, err = h.trace("k", 1005); err != nil || tr.Offset != 1 || tr.Duplicates != 0 || tr.Groups["g"].State != group.KeySkipped {
		t.Fatalf("after a re-publish: %+v %v, want offset 1, skipped", tr, err)
	}
	if _, err := h.trace("nope", 1005); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
}

// BenchmarkReconcile10k answers a reconcile of 10,000 keys (9,000 stored,
// 1,000 missing) against a topic with two groups, one having acked half
// of the messages: one read transaction, as the HTTP handler runs it.
func BenchmarkReconcile10k(b *testing.B) {
	h := mustFSM(b)
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1, Format: StateFormat})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(4))}})
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%06d", i)
	}
	for i := 0; i < 9000; i += 500 {
		var msgs []mlog.Placed
		for _, k := range keys[i : i+500] {
			msgs = append(msgs, keyed(uint32(len(k)%4), k, "payload"))
		}
		h.must(publish(2, "t", msgs...))
	}
	h.must(&command.Command{Op: command.OpPutGroup, Now: 3, Topic: "t", Group: "idle"})
	for acked := 0; acked < 4500; {
		r := h.must(&command.Command{Op: command.OpLease, Now: 4, Topic: "t", Group: "g", Max: 500, LeaseMs: 60000})
		h.must(&command.Command{Op: command.OpAck, Now: 5, Topic: "t", Group: "g", Receipts: receipts(r.Deliveries)})
		acked += len(r.Deliveries)
	}
	b.ResetTimer()
	for b.Loop() {
		var rec *Reconciliation
		if err := h.f.Read(func(r *Reader) error {
			var err error
			rec, err = r.Reconcile("t", keys, "", 6)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if len(rec.Missing) != 1000 || rec.Stored != 9000 || len(rec.Groups["g"].Acked) < 4500 {
			b.Fatalf("missing %d, stored %d, acked %d", len(rec.Missing), rec.Stored, len(rec.Groups["g"].Acked))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/10k-keys")
}
