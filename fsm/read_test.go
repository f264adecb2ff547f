package fsm

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// mustRead runs fn in one Reader and fails the test on an error.
func mustRead(t *testing.T, f *FSM, fn func(r *Reader) error) {
	t.Helper()
	if err := f.Read(fn); err != nil {
		t.Fatal(err)
	}
}

// The Reader's getters answer what the applied commands left: topic
// config and stats, pages of topics, dead letters (copied out of the
// transaction), the follower long-poll's outlook and the scrape gauges.
func TestReaderGetters(t *testing.T) {
	h := mustFSM(t)
	two := uint32(2)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "a", Patch: mlog.Patch{Partitions: &two}})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "b"})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "c"})
	h.must(publish(1, "a", keyed(0, "k1", "v1"), keyed(1, "", "value-2"), keyed(1, "", "v3")))
	h.must(&command.Command{Op: command.OpPutGroup, Now: 2, Topic: "a", Group: "idle"})
	ds := h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "a", Group: "g", Max: 1, LeaseMs: 1000}).Deliveries
	h.must(&command.Command{Op: command.OpNack, Now: 20, Topic: "a", Group: "g", Receipts: receipts(ds), Reason: "poison", Retryable: true, DelayMs: 0})

	mustRead(t, h.f, func(r *Reader) error {
		if got := r.AppliedIndex(); got != h.idx {
			t.Errorf("AppliedIndex = %d, want %d", got, h.idx)
		}
		if cfg, err := r.TopicConfig("a"); err != nil || cfg.Partitions != 2 {
			t.Errorf("TopicConfig(a) = %+v, %v; want 2 partitions", cfg, err)
		}
		if _, err := r.TopicConfig("nope"); !errors.Is(err, mlog.ErrTopicNotFound) {
			t.Errorf("TopicConfig(nope): %v, want ErrTopicNotFound", err)
		}
		var names []string
		r.EachTopicAfter("a", func(n string) bool { names = append(names, n); return len(names) < 1 })
		if !reflect.DeepEqual(names, []string{"b"}) {
			t.Errorf("EachTopicAfter(a) stopping after one = %v, want [b]", names)
		}
		st, err := r.TopicStats("a", 30)
		if err != nil {
			t.Fatal(err)
		}
		wantParts := []PartitionStats{{0, 0, 1, 1}, {1, 0, 2, 2}}
		if st.Name != "a" || st.Messages != 3 || st.Bytes != uint64(len("v1value-2v3")) || !reflect.DeepEqual(st.Partitions, wantParts) {
			t.Errorf("TopicStats(a) = %+v, want 3 messages of 11 bytes in %v", st, wantParts)
		}
		if g := st.Groups["g"]; g.DLQ != 0 || g.Backlog != 3 || g.InFlight != 0 {
			t.Errorf("TopicStats(a).Groups[g] = %+v, want a backlog of 3 (nacked retryable + 2 new)", g)
		}
		if _, ok := st.Groups["idle"]; !ok || len(st.Groups) != 2 {
			t.Errorf("TopicStats(a).Groups = %v, want g and idle", st.Groups)
		}
		lease, due, err := r.LeaseOutlook("a", "g", 30)
		if err != nil || !lease || !due.IsZero() {
			t.Errorf("LeaseOutlook(a, g) = %v %v %v, want a lease (messages past the cursor)", lease, due, err)
		}
		if lease, _, err := r.LeaseOutlook("a", "new", 30); err != nil || !lease {
			t.Errorf("LeaseOutlook of a missing group = %v %v, want a lease (the fetch creates it)", lease, err)
		}
		if _, _, err := r.LeaseOutlook("nope", "g", 30); !errors.Is(err, mlog.ErrTopicNotFound) {
			t.Errorf("LeaseOutlook of a missing topic: %v, want ErrTopicNotFound", err)
		}
		return nil
	})

	// Everything leased, one message nacked with a delay: no lease now,
	// due when its delay ends.
	all := h.must(&command.Command{Op: command.OpLease, Now: 40, Topic: "a", Group: "g", Max: 10, LeaseMs: 60000}).Deliveries
	h.must(&command.Command{Op: command.OpNack, Now: 50, Topic: "a", Group: "g", Receipts: receipts(all[:1]), Reason: "later", Retryable: true, DelayMs: 5000})
	h.must(&command.Command{Op: command.OpNack, Now: 60, Topic: "a", Group: "g", Receipts: receipts(all[1:2]), Reason: "dead",
		Retryable: false, DelayMs: -1})
	mustRead(t, h.f, func(r *Reader) error {
		lease, due, err := r.LeaseOutlook("a", "g", 70)
		if err != nil || lease || !due.Equal(time.UnixMilli(5050)) {
			t.Errorf("LeaseOutlook(a, g) = %v %v %v, want no lease, due at 5050 ms", lease, due, err)
		}
		letters, err := r.DeadLetters("a", "g", 0, 10, "")
		if err != nil || len(letters) != 1 || letters[0].RejectReason != "dead" {
			t.Errorf("DeadLetters(a, g) = %+v, %v; want the one rejected", letters, err)
		}
		if _, err := r.DeadLetters("a", "none", 0, 10, ""); !errors.Is(err, group.ErrGroupNotFound) {
			t.Errorf("DeadLetters of a missing group: %v, want ErrGroupNotFound", err)
		}
		var got []TopicGauges
		r.EachTopicGauges(70, func(tg *TopicGauges) {
			c := *tg
			c.Groups = append([]GroupGauges(nil), tg.Groups...)
			got = append(got, c)
		})
		want := []TopicGauges{
			{Name: "a", Messages: 3, Bytes: 11, Groups: []GroupGauges{
				{"g", group.Gauges{Waiting: 1, InFlight: 1, DLQ: 1}},
				{"idle", group.Gauges{Waiting: 3}},
			}},
			{Name: "b"},
			{Name: "c"},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("EachTopicGauges = %+v\nwant %+v", got, want)
		}
		return nil
	})
	// A letter read in one transaction stays intact after it, while
	// later transactions change the state.
	var kept []*dlq.Letter
	mustRead(t, h.f, func(r *Reader) error {
		var err error
		kept, err = r.DeadLetters("a", "g", 0, 10, "")
		return err
	})
	for i := range 50 {
		h.must(publish(int64(100+i), "a", msg("overwrite-overwrite-overwrite")))
	}
	if len(kept) != 1 || kept[0].RejectReason != "dead" || string(kept[0].Msg.Value) != "value-2" {
		t.Errorf("a dead letter kept after its transaction = %+v", kept)
	}
}
