package fsm

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// A lease's result carries its messages, copied out of the transaction
// that chose them, only while someone on the node waits for a lease (a
// follower builds none); FillLeased reads them for a result without.
func TestLeaseResultMessages(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{MaxMessages: ptr(int64(4)),
		Overflow: ptr(mlog.OverflowDropHead), MaxRetry: ptr(int64(7))}})
	a := keyed(0, "ka", strings.Repeat("a", 3000))
	a.Msg.Attrs = []mlog.Attr{{Name: "n", Value: "v"}}
	b := msg(strings.Repeat("b", 3000))
	b.Msg.MaxRetry = 2
	h.must(publish(1000, "t", a, b, msg("c"), msg("d")))

	nobody := h.must(&command.Command{Op: command.OpLease, Now: 2000, Topic: "t", Group: "g1", Max: 2, LeaseMs: 60000}).Deliveries
	if len(nobody) != 2 || nobody[0].Msg != nil || nobody[1].Msg != nil {
		t.Fatalf("lease with nobody waiting: %+v, want 2 deliveries without messages", nobody)
	}
	done := h.f.AwaitLease()
	r := h.apply(&command.Command{Op: command.OpMulti, Batch: []*command.Command{
		{Op: command.OpLease, Now: 2000, Topic: "t", Group: "g2", Max: 2, LeaseMs: 60000},
		{Op: command.OpLease, Now: 2000, Topic: "t", Group: "g3", Max: 1, LeaseMs: 60000},
	}})
	done()
	got := append(r.Multi[0].Deliveries, r.Multi[1].Deliveries...)
	if len(got) != 3 {
		t.Fatalf("leases while waiting: %+v", got)
	}
	want := []mlog.Message{
		{PublishedAt: 1000, IdempotencyKey: "ka", MaxRetry: 7, BackoffBaseMs: -1, BackoffJitterMs: -1, Attrs: a.Msg.Attrs, Value: []byte(strings.Repeat("a", 3000))},
		{PublishedAt: 1000, MaxRetry: 2, BackoffBaseMs: -1, BackoffJitterMs: -1, Attrs: []mlog.Attr{}, Value: []byte(strings.Repeat("b", 3000))},
		{PublishedAt: 1000, IdempotencyKey: "ka", MaxRetry: 7, BackoffBaseMs: -1, BackoffJitterMs: -1, Attrs: a.Msg.Attrs, Value: []byte(strings.Repeat("a", 3000))},
	}
	wantOff := []uint64{0, 1, 0}
	check := func(when string, ds []group.Delivery) {
		t.Helper()
		for i, d := range ds {
			if d.Msg == nil {
				t.Fatalf("%s: delivery %d has no message", when, i)
			}
			m := *d.Msg
			m.Offset = 0
			if len(m.Attrs) == 0 {
				m.Attrs = []mlog.Attr{}
			}
			if d.Offset != wantOff[i] || !reflect.DeepEqual(m, want[i]) {
				t.Fatalf("%s: delivery %d = offset %d %+v, want offset %d %+v", when, i, d.Offset, short(m), wantOff[i], short(want[i]))
			}
		}
	}
	check("in the result", got)
	filled, err := h.f.FillLeased("t", nobody)
	if err != nil {
		t.Fatal(err)
	}
	check("filled", filled)

	// The copies outlive their transaction: drop-head deletes the leased
	// messages and new ones reuse the freed pages.
	for i := range 40 {
		h.must(publish(int64(3000+i), "t", msg(strings.Repeat("z", 3000)), msg(strings.Repeat("y", 3000))))
	}
	check("after their pages were reused", got)
	check("filled, after their pages were reused", filled)

	// FillLeased leaves out what is no longer retained.
	filled, err = h.f.FillLeased("t", nobody)
	if err != nil || len(filled) != 0 {
		t.Fatalf("FillLeased of trimmed messages = %+v, %v; want none", filled, err)
	}
}

func short(m mlog.Message) mlog.Message {
	if len(m.Value) > 8 {
		m.Value = append(bytes.Clone(m.Value[:8]), "..."...)
	}
	return m
}

// BenchmarkApplyLease applies OpLease entries of 100 messages (1 KiB) over
// a backlog, as every node does; msgs=true as the node where the fetch
// waits (the result carries copies of the messages), false as a follower.
// b.N is messages: ns/op, B/op and allocs/op are per message leased.
//
//	go test -run '^$' -bench ApplyLease ./raftfsm/
func BenchmarkApplyLease(b *testing.B) {
	const max = 100
	val := bytes.Repeat([]byte("x"), 1024)
	for _, msgs := range []bool{false, true} {
		b.Run("msgs="+map[bool]string{false: "false", true: "true"}[msgs], func(b *testing.B) {
			h := mustFSM(b)
			h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
			for done := 0; done < b.N; done += 500 {
				c := &command.Command{Op: command.OpPublish, Now: 1, Topic: "t"}
				for range min(500, b.N-done) {
					c.Msgs = append(c.Msgs, mlog.Placed{Msg: &mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: val}})
				}
				h.must(c)
			}
			if msgs {
				defer h.f.AwaitLease()()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for got := 0; got < b.N; {
				b.StopTimer()
				logs := []*raft.Log{{Index: h.idx + 1, Term: 1, Type: raft.LogCommand,
					Data: (&command.Command{Op: command.OpLease, Now: 2, Topic: "t", Group: "g", Max: max, LeaseMs: 60000}).Encode()}}
				h.idx++
				b.StartTimer()
				r := h.f.ApplyBatch(logs)[0].(*Result)
				if r.Err != nil || len(r.Deliveries) == 0 || (r.Deliveries[0].Msg != nil) != msgs {
					b.Fatalf("lease: %+v", r)
				}
				got += len(r.Deliveries)
			}
		})
	}
}
