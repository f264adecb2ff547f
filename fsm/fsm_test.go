package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/dlq"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// harness drives an FSM with hand-made raft log entries, without raft.
type harness struct {
	t        testing.TB
	f        *FSM
	idx      uint64 // index of the last entry applied
	notified map[string]int
}

func ptr[T any](v T) *T { return &v }

func mustFSM(t testing.TB) *harness {
	t.Helper()
	f, err := OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h := &harness{t: t, f: f, notified: map[string]int{}}
	f.OnNotify(func(topics map[string]struct{}) {
		for tp := range topics {
			h.notified[tp]++
		}
	})
	return h
}

// batch applies cmds as one raft batch, at the next indexes.
func (h *harness) batch(cmds ...*command.Command) []*Result {
	h.t.Helper()
	logs := make([]*raft.Log, len(cmds))
	for i, c := range cmds {
		h.idx++
		logs[i] = &raft.Log{Index: h.idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()}
	}
	out := h.f.ApplyBatch(logs)
	if len(out) != len(cmds) {
		h.t.Fatalf("ApplyBatch returned %d results for %d entries", len(out), len(cmds))
	}
	res := make([]*Result, len(out))
	for i, o := range out {
		r, ok := o.(*Result)
		if !ok || r == nil {
			h.t.Fatalf("result %d is %T %v, want *Result", i, o, o)
		}
		res[i] = r
	}
	if got := h.f.AppliedIndex(); got != h.idx {
		h.t.Fatalf("AppliedIndex = %d after applying up to %d", got, h.idx)
	}
	return res
}

// apply applies one command in a batch of its own.
func (h *harness) apply(c *command.Command) *Result {
	h.t.Helper()
	return h.batch(c)[0]
}

// must applies c and fails the test on a business error.
func (h *harness) must(c *command.Command) *Result {
	h.t.Helper()
	r := h.apply(c)
	if r.Err != nil {
		h.t.Fatalf("%s: %v", c.Op, r.Err)
	}
	return r
}

func msg(v string) mlog.Placed {
	return mlog.Placed{Msg: &mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte(v)}}
}

func keyed(p uint32, key, v string) mlog.Placed {
	m := msg(v)
	m.Partition = p
	m.Msg.IdempotencyKey = key
	return m
}

func publish(now int64, topic string, msgs ...mlog.Placed) *command.Command {
	return &command.Command{Op: command.OpPublish, Now: now, Topic: topic, Msgs: msgs}
}

// dumpDB lists every key and value of the database except the applied
// index, with bucket paths.
func dumpDB(t testing.TB, f *FSM) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, b *bolt.Bucket) error
	walk = func(path string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			p := path + "/" + hex.EncodeToString(k)
			if v == nil {
				return walk(p, b.Bucket(k))
			}
			out[p] = hex.EncodeToString(v)
			return nil
		})
	}
	if err := f.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if bytes.Equal(name, bktMeta) {
				return nil
			}
			return walk(string(name), b)
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func diffDumps(a, b map[string]string) string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "only in first: "+k)
		} else if v != w {
			d = append(d, fmt.Sprintf("differs: %s: %s vs %s", k, v, w))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "only in second: "+k)
		}
	}
	slices.Sort(d)
	if len(d) > 20 {
		d = append(d[:20], fmt.Sprintf("... %d more", len(d)-20))
	}
	return strings.Join(d, "\n")
}

type topicState struct {
	Config mlog.Config
	Parts  []mlog.PartitionMeta
	Groups map[string]group.Stats
}

// topicStates reads every topic's config, partitions and group stats.
func topicStates(t testing.TB, f *FSM, now int64) map[string]topicState {
	t.Helper()
	out := map[string]topicState{}
	if err := f.View(func(tx *bolt.Tx) error {
		for _, name := range mlog.Topics(tx) {
			l, err := mlog.Open(tx, name)
			if err != nil {
				return err
			}
			st := topicState{Config: l.Cfg, Groups: map[string]group.Stats{}}
			if st.Parts, err = mlog.Partitions(tx, name); err != nil {
				return err
			}
			for _, gn := range group.Names(l) {
				g, err := group.Open(tx, l, gn, false, now)
				if err != nil {
					return err
				}
				if st.Groups[gn], err = g.Stats(now); err != nil {
					return err
				}
			}
			out[name] = st
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func parts(t testing.TB, f *FSM, topic string) []mlog.PartitionMeta {
	t.Helper()
	var out []mlog.PartitionMeta
	if err := f.View(func(tx *bolt.Tx) error {
		var err error
		out, err = mlog.Partitions(tx, topic)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func receipts(ds []group.Delivery) []group.Receipt {
	out := make([]group.Receipt, len(ds))
	for i, d := range ds {
		out[i] = group.Receipt{Partition: d.Partition, Offset: d.Offset, Delivery: d.Delivery}
	}
	return out
}

func TestApplyPutTopic(t *testing.T) {
	h := mustFSM(t)
	if r := h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(2))}}); !r.Created {
		t.Fatalf("first put: Created = false")
	}
	if r := h.must(&command.Command{Op: command.OpPutTopic, Now: 2, Topic: "t", Patch: mlog.Patch{MaxRetry: ptr(int64(1))}}); r.Created {
		t.Fatalf("second put: Created = true")
	}
	for _, tc := range []struct {
		c    *command.Command
		want error
	}{
		{&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(1))}}, mlog.ErrPartitionShrink},
		{&command.Command{Op: command.OpPutTopic, Topic: "..", Patch: mlog.Patch{}}, mlog.ErrInvalidName},
		{&command.Command{Op: command.OpPutTopic, Topic: "u", Patch: mlog.Patch{AckTimeoutMs: ptr(int64(0))}}, mlog.ErrInvalidConfig},
		{&command.Command{Op: command.OpDeleteTopic, Topic: "nope"}, mlog.ErrTopicNotFound},
	} {
		if r := h.apply(tc.c); !errors.Is(r.Err, tc.want) {
			t.Errorf("%s %q: Err = %v, want %v", tc.c.Op, tc.c.Topic, r.Err, tc.want)
		}
	}
	st := topicStates(t, h.f, 0)
	if len(st) != 1 || st["t"].Config.Partitions != 2 || st["t"].Config.MaxRetry != 1 {
		t.Fatalf("topics after puts = %+v", st)
	}
}

func TestApplyPublishPlacesAndStamps(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(3))}})
	a, b, c := msg("a"), msg("b"), msg("c")
	a.Partition, b.Partition, c.Partition = 2, 5, 2 // 5 mod 3 = 2
	r := h.must(publish(1234, "t", a, b, c))
	want := []Published{{Partition: 2, Offset: 0}, {Partition: 2, Offset: 1}, {Partition: 2, Offset: 2}}
	if !reflect.DeepEqual(r.Published, want) {
		t.Fatalf("Published = %+v, want %+v", r.Published, want)
	}
	if h.notified["t"] != 1 {
		t.Fatalf("Notify for t called %d times, want 1", h.notified["t"])
	}
	_ = h.f.View(func(tx *bolt.Tx) error {
		p, _ := mlog.OpenPartition(tx, "t", 2)
		m, err := p.Get(1)
		if err != nil || m == nil || string(m.Value) != "b" || m.PublishedAt != 1234 {
			t.Fatalf("stored message = %+v, %v; want b published at 1234", m, err)
		}
		return nil
	})
	if r := h.apply(publish(1, "nope", msg("x"))); !errors.Is(r.Err, mlog.ErrTopicNotFound) {
		t.Fatalf("publish to unknown topic: Err = %v", r.Err)
	}
}

func TestApplyPublishBatchAtomic(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{
		Partitions: ptr(uint32(2)), MaxMessages: ptr(int64(3)), MaxMessageBytes: ptr(int64(8)),
	}})
	h.must(publish(1, "t", keyed(0, "k1", "a"), keyed(1, "k2", "b")))
	before := dumpDB(t, h.f)
	notifiedBefore := h.notified["t"]

	// Two more would make 4 > max_messages 3 under reject-publish.
	r := h.apply(publish(2, "t", keyed(0, "k3", "c"), keyed(1, "k4", "d")))
	if !errors.Is(r.Err, mlog.ErrTopicFull) {
		t.Fatalf("over-limit batch: Err = %v, want ErrTopicFull", r.Err)
	}
	// One message too large refuses the whole batch.
	r = h.apply(publish(3, "t", keyed(0, "k5", "e"), keyed(1, "k6", "123456789")))
	if !errors.Is(r.Err, mlog.ErrTooLarge) {
		t.Fatalf("batch with a large message: Err = %v, want ErrTooLarge", r.Err)
	}
	if after := dumpDB(t, h.f); !reflect.DeepEqual(after, before) {
		t.Fatalf("refused batches changed state:\n%s", diffDumps(before, after))
	}
	if h.notified["t"] != notifiedBefore {
		t.Fatalf("refused batches notified waiters")
	}
	// Their keys were not recorded: publishing them now stores them (and
	// shows that the dump sees a stored message).
	r = h.must(publish(4, "t", keyed(0, "k3", "c")))
	if after := dumpDB(t, h.f); reflect.DeepEqual(after, before) {
		t.Fatalf("a stored message did not change the dump")
	}
	if r.Published[0].Duplicate || r.Published[0].Offset != 1 {
		t.Fatalf("publish after refusals = %+v", r.Published)
	}
	if p := parts(t, h.f, "t"); p[0].Count()+p[1].Count() != 3 {
		t.Fatalf("partitions = %+v, want 3 messages", p)
	}
}

func TestApplyBatchCommandsIndependent(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{MaxMessages: ptr(int64(2))}})
	rs := h.batch(
		publish(1, "t", msg("a")),
		publish(2, "t", msg("b"), msg("c")), // would make 3
		publish(3, "t", msg("d")),
		&command.Command{Op: command.OpLease, Now: 4, Topic: "missing", Group: "g", Max: 1, LeaseMs: 10},
		publish(5, "t", msg("e")), // full now
	)
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = r.Err
	}
	if rs[0].Err != nil || !errors.Is(rs[1].Err, mlog.ErrTopicFull) || rs[2].Err != nil ||
		!errors.Is(rs[3].Err, mlog.ErrTopicNotFound) || !errors.Is(rs[4].Err, mlog.ErrTopicFull) {
		t.Fatalf("batch errors = %v", errs)
	}
	if rs[2].Published[0].Offset != 1 {
		t.Fatalf("third command stored at %+v, want offset 1", rs[2].Published)
	}
	if p := parts(t, h.f, "t")[0]; p != (mlog.PartitionMeta{First: 0, Next: 2, Bytes: 2}) {
		t.Fatalf("partition after the batch = %+v", p)
	}
}

func TestApplyPublishDropHeadTrimsGroups(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{MaxMessages: ptr(int64(2)), Overflow: ptr(mlog.OverflowDropHead)}})
	h.must(publish(1, "t", msg("a"), msg("b")))
	ds := h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "t", Group: "g", Max: 1, LeaseMs: 1000}).Deliveries
	if len(ds) != 1 || ds[0].Offset != 0 {
		t.Fatalf("lease = %+v", ds)
	}
	h.must(publish(20, "t", msg("c")))
	if p := parts(t, h.f, "t")[0]; p != (mlog.PartitionMeta{First: 1, Next: 3, Bytes: 2}) {
		t.Fatalf("partition after drop-head = %+v", p)
	}
	st := topicStates(t, h.f, 30)["t"].Groups["g"]
	if st.InFlight != 0 || st.Backlog != 2 {
		t.Fatalf("group after its leased head was dropped = %+v, want in_flight 0 backlog 2", st)
	}
	r := h.must(&command.Command{Op: command.OpAck, Now: 30, Topic: "t", Group: "g", Receipts: receipts(ds)})
	if !reflect.DeepEqual(r.Statuses, []string{group.StatusStale}) {
		t.Fatalf("ack of a dropped message = %v, want [stale]", r.Statuses)
	}
	var due []group.Expired
	_ = h.f.View(func(tx *bolt.Tx) error {
		var err error
		due, err = group.DueLeases(tx, 1<<40, 10)
		return err
	})
	if len(due) != 0 {
		t.Fatalf("dropped message still in the lease-expiry index: %+v", due)
	}
}

func TestApplyLeaseAckExtendExpire(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.must(publish(1, "t", msg("a"), msg("b"), msg("c")))
	lr := h.must(&command.Command{Op: command.OpLease, Now: 5000, Topic: "t", Group: "g", Max: 2, LeaseMs: 1000})
	leaseIdx := h.idx
	if len(lr.Deliveries) != 2 || lr.Deliveries[0].Offset != 0 || lr.Deliveries[1].Offset != 1 {
		t.Fatalf("deliveries = %+v", lr.Deliveries)
	}
	for _, d := range lr.Deliveries {
		if d.Delivery != leaseIdx {
			t.Fatalf("delivery id = %d, want the lease's raft index %d", d.Delivery, leaseIdx)
		}
	}
	rs := receipts(lr.Deliveries)
	if r := h.must(&command.Command{Op: command.OpAck, Now: 5100, Topic: "t", Group: "g", Receipts: rs[:1]}); !reflect.DeepEqual(r.Statuses, []string{"ok"}) {
		t.Fatalf("ack = %v", r.Statuses)
	}
	if r := h.must(&command.Command{Op: command.OpAck, Now: 5101, Topic: "t", Group: "g", Receipts: rs[:1]}); !reflect.DeepEqual(r.Statuses, []string{"stale"}) {
		t.Fatalf("second ack = %v", r.Statuses)
	}
	if r := h.must(&command.Command{Op: command.OpExtend, Now: 5500, Topic: "t", Group: "g", LeaseMs: 2000, Receipts: rs[1:]}); !reflect.DeepEqual(r.Statuses, []string{"ok"}) {
		t.Fatalf("extend = %v", r.Statuses) // now until 7500
	}
	// The leader's sweeper: find due leases, propose OpExpire.
	dueAt := func(now int64) []group.Expired {
		var due []group.Expired
		_ = h.f.View(func(tx *bolt.Tx) error {
			var err error
			due, err = group.DueLeases(tx, now, 100)
			return err
		})
		return due
	}
	if due := dueAt(7499); len(due) != 0 {
		t.Fatalf("due before the extended expiry: %+v", due)
	}
	// An expire proposed for the old expiry time changes nothing.
	h.must(&command.Command{Op: command.OpExpire, Now: 6000, Expired: []group.Expired{{Topic: "t", Group: "g", Receipt: rs[1]}}})
	if st := topicStates(t, h.f, 6000)["t"].Groups["g"]; st.InFlight != 1 {
		t.Fatalf("early expire changed state: %+v", st)
	}
	due := dueAt(7500)
	if len(due) != 1 || due[0].Receipt != rs[1] {
		t.Fatalf("due at 7500 = %+v", due)
	}
	h.notified = map[string]int{}
	h.must(&command.Command{Op: command.OpExpire, Now: 7500, NodeID: "n1", Rands: []uint32{1 << 31, 0, 0}, Expired: append(due,
		group.Expired{Topic: "gone", Group: "g", Receipt: rs[1]}, // deleted topics are skipped
		group.Expired{Topic: "t", Group: "nogroup", Receipt: rs[1]},
	)})
	if h.notified["t"] != 1 {
		t.Fatalf("expire did not notify t")
	}
	// Retry 1 waits backoff_base_ms 1000 plus half the 1000 ms jitter (rand
	// 2^31): due at 7500+1500.
	if st := topicStates(t, h.f, 8999)["t"].Groups["g"]; st != (group.Stats{Backlog: 1, Delayed: 1, Acked: 1}) {
		t.Fatalf("stats after expire = %+v", st)
	}
	if st := topicStates(t, h.f, 9000)["t"].Groups["g"]; st != (group.Stats{Backlog: 2, Acked: 1}) {
		t.Fatalf("stats once the retry is due = %+v", st)
	}
	lr = h.must(&command.Command{Op: command.OpLease, Now: 9000, Topic: "t", Group: "g", Max: 10, LeaseMs: 1000})
	want := []group.Delivery{
		{Partition: 0, Offset: 1, RetryCount: 1, Delivery: h.idx, Reason: "lease expired"},
		{Partition: 0, Offset: 2, RetryCount: 0, Delivery: h.idx},
	}
	if !reflect.DeepEqual(lr.Deliveries, want) {
		t.Fatalf("lease after expiry = %+v, want %+v", lr.Deliveries, want)
	}
	if r := h.must(&command.Command{Op: command.OpAck, Now: 9001, Topic: "t", Group: "g", Receipts: rs[1:]}); !reflect.DeepEqual(r.Statuses, []string{"stale"}) {
		t.Fatalf("ack with the pre-expiry receipt = %v, want [stale]", r.Statuses)
	}
}

func TestApplyNackDeadLetterReplay(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.must(publish(1, "t", msg("a"), msg("b")))
	ds := h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "t", Group: "g", Max: 2, LeaseMs: 1000}).Deliveries
	r := h.must(&command.Command{Op: command.OpNack, Now: 20, Topic: "t", Group: "g", Receipts: receipts(ds), NodeID: "n1",
		Reason: "poison", Retryable: false, DelayMs: -1})
	if !reflect.DeepEqual(r.Statuses, []string{"ok", "ok"}) {
		t.Fatalf("nack = %v", r.Statuses)
	}
	if st := topicStates(t, h.f, 30)["t"].Groups["g"]; st != (group.Stats{DLQ: 2}) {
		t.Fatalf("stats after rejecting both = %+v", st)
	}
	if r := h.apply(&command.Command{Op: command.OpDeleteDeadLetter, Now: 30, Topic: "t", Group: "g", IDs: []uint64{99}}); !errors.Is(r.Err, dlq.ErrNotFound) {
		t.Fatalf("delete of an unknown dead letter: Err = %v, want dlq.ErrNotFound", r.Err)
	}
	if r := h.must(&command.Command{Op: command.OpReplay, Now: 40, Topic: "t", Group: "g", All: true, Rate: 10}); r.Accepted != 2 {
		t.Fatalf("replay accepted %d, want 2", r.Accepted)
	}
	if r := h.must(&command.Command{Op: command.OpReplayStep, Now: 50, Topic: "t", Group: "g", Max: 1}); r.Accepted != 1 {
		t.Fatalf("first replay step accepted %d, want 1", r.Accepted)
	}
	if st := topicStates(t, h.f, 50)["t"].Groups["g"]; st.DLQ != 1 || st.Backlog != 1 || st.ReplayPending != 1 {
		t.Fatalf("stats after one replay step = %+v", st)
	}
	ds = h.must(&command.Command{Op: command.OpLease, Now: 60, Topic: "t", Group: "g", Max: 10, LeaseMs: 1000}).Deliveries
	if len(ds) != 1 || ds[0].Offset != 0 || ds[0].RetryCount != 0 {
		t.Fatalf("replayed delivery = %+v, want 0/0 with retry_count reset", ds)
	}
}

func TestApplyDropHeadFreesHeldKey(t *testing.T) {
	h := mustFSM(t)
	// No publish dedup, so two messages may carry the same key.
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{DedupWindowMs: ptr(int64(0)),
		MaxMessages: ptr(int64(2)), Overflow: ptr(mlog.OverflowDropHead)}})
	h.must(publish(1, "t", keyed(0, "K", "a"), keyed(0, "K", "b")))
	ds := h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "t", Group: "g", Max: 10, LeaseMs: 60000}).Deliveries
	if len(ds) != 1 || ds[0].Offset != 0 {
		t.Fatalf("lease = %+v, want only 0/0 (0/1 held behind K)", ds)
	}
	h.must(publish(20, "t", msg("c"))) // drops 0/0
	ds = h.must(&command.Command{Op: command.OpLease, Now: 30, Topic: "t", Group: "g", Max: 10, LeaseMs: 60000}).Deliveries
	var offs []uint64
	for _, d := range ds {
		offs = append(offs, d.Offset)
	}
	if !reflect.DeepEqual(offs, []uint64{1, 2}) {
		t.Fatalf("lease after drop-head = offsets %v, want [1 2]", offs)
	}
}

func TestApplyGroupErrors(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	for _, tc := range []struct {
		c    *command.Command
		want error
	}{
		{&command.Command{Op: command.OpAck, Topic: "t", Group: "none", Receipts: []group.Receipt{{}}}, group.ErrGroupNotFound},
		{&command.Command{Op: command.OpExtend, Topic: "t", Group: "none", LeaseMs: 1, Receipts: []group.Receipt{{}}}, group.ErrGroupNotFound},
		{&command.Command{Op: command.OpDeleteGroup, Topic: "t", Group: "none"}, group.ErrGroupNotFound},
		{&command.Command{Op: command.OpLease, Topic: "t", Group: "a/b", Max: 1, LeaseMs: 1}, mlog.ErrInvalidName},
		{&command.Command{Op: command.OpPutGroup, Topic: "t", Group: ".."}, mlog.ErrInvalidName},
		{&command.Command{Op: command.OpLease, Topic: "none", Group: "g", Max: 1, LeaseMs: 1}, mlog.ErrTopicNotFound},
		{&command.Command{Op: command.OpPutGroup, Topic: "none", Group: "g"}, mlog.ErrTopicNotFound},
		{&command.Command{Op: command.OpTrim, Topic: "none"}, mlog.ErrTopicNotFound},
	} {
		if r := h.apply(tc.c); !errors.Is(r.Err, tc.want) {
			t.Errorf("%s %s/%s: Err = %v, want %v", tc.c.Op, tc.c.Topic, tc.c.Group, r.Err, tc.want)
		}
	}
	if g := topicStates(t, h.f, 0)["t"].Groups; len(g) != 0 {
		t.Fatalf("failed commands created groups: %v", g)
	}
	if r := h.must(&command.Command{Op: command.OpPutGroup, Topic: "t", Group: "g"}); !r.Created {
		t.Fatalf("put group: Created = false")
	}
	if r := h.must(&command.Command{Op: command.OpPutGroup, Topic: "t", Group: "g"}); r.Created {
		t.Fatalf("second put group: Created = true")
	}
	h.must(&command.Command{Op: command.OpDeleteGroup, Topic: "t", Group: "g"})
	if g := topicStates(t, h.f, 0)["t"].Groups; len(g) != 0 {
		t.Fatalf("groups after delete = %v", g)
	}
}

func TestApplyTrimRetention(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{RetentionMs: ptr(int64(1000))}})
	h.must(publish(1000, "t", msg("a"), msg("b")))
	h.must(&command.Command{Op: command.OpTrim, Now: 1999, Topic: "t"}) // cutoff 999: nothing
	if p := parts(t, h.f, "t")[0]; p.First != 0 {
		t.Fatalf("trim before retention passed: %+v", p)
	}
	h.must(publish(3000, "t", msg("c")))
	h.must(&command.Command{Op: command.OpTrim, Now: 2500, Topic: "t"}) // applied at 3000 (time never goes back): cutoff 2000
	if p := parts(t, h.f, "t")[0]; p != (mlog.PartitionMeta{First: 2, Next: 3, Bytes: 1}) {
		t.Fatalf("after retention trim = %+v", p)
	}
}

func TestApplyTrimToGroupFloor(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.must(publish(1, "t", msg("a"), msg("b"), msg("c")))
	h.must(&command.Command{Op: command.OpTrim, Now: 10, Topic: "t"})
	if p := parts(t, h.f, "t")[0]; p.First != 0 {
		t.Fatalf("trim without groups dropped messages: %+v", p)
	}
	h.must(&command.Command{Op: command.OpPutGroup, Now: 10, Topic: "t", Group: "slow"})
	ds := h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "t", Group: "fast", Max: 3, LeaseMs: 1000}).Deliveries
	h.must(&command.Command{Op: command.OpAck, Now: 11, Topic: "t", Group: "fast", Receipts: receipts(ds)[:1]})
	h.must(&command.Command{Op: command.OpTrim, Now: 12, Topic: "t"})
	if p := parts(t, h.f, "t")[0]; p.First != 0 {
		t.Fatalf("trimmed below the idle group's floor: %+v", p)
	}
	h.must(&command.Command{Op: command.OpDeleteGroup, Topic: "t", Group: "slow"})
	var plan []mlog.Trimmed
	_ = h.f.View(func(tx *bolt.Tx) error {
		l, _ := mlog.Open(tx, "t")
		var err error
		plan, err = TrimPlan(tx, l, 13)
		return err
	})
	if !reflect.DeepEqual(plan, []mlog.Trimmed{{Partition: 0, NewFirst: 1}}) {
		t.Fatalf("TrimPlan = %+v, want up to the first unfinished offset 1", plan)
	}
	h.must(&command.Command{Op: command.OpTrim, Now: 13, Topic: "t"})
	if p := parts(t, h.f, "t")[0]; p.First != 1 {
		t.Fatalf("after trim to floor = %+v", p)
	}
}

func TestApplyDeleteTopicDropsLeases(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "u"})
	h.must(publish(1, "t", msg("a")))
	h.must(publish(1, "u", msg("a")))
	h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "t", Group: "g", Max: 1, LeaseMs: 100})
	h.must(&command.Command{Op: command.OpLease, Now: 10, Topic: "u", Group: "g", Max: 1, LeaseMs: 100})
	h.must(&command.Command{Op: command.OpDeleteTopic, Topic: "t"})
	var due []group.Expired
	if err := h.f.View(func(tx *bolt.Tx) error {
		var err error
		due, err = group.DueLeases(tx, 1<<40, 10)
		return err
	}); err != nil {
		t.Fatalf("DueLeases after topic delete: %v", err)
	}
	if len(due) != 1 || due[0].Topic != "u" {
		t.Fatalf("due leases = %+v", due)
	}
	if st := topicStates(t, h.f, 0); len(st) != 1 {
		t.Fatalf("topics = %v", st)
	}
}

func TestApplyPublishIdempotencyKeys(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(2)), DedupWindowMs: ptr(int64(1000))}})
	r := h.must(publish(1000, "t", keyed(1, "K", "a"), keyed(0, "L", "b"), keyed(0, "K", "c")))
	want := []Published{{1, 0, false}, {0, 0, false}, {1, 0, true}}
	if !reflect.DeepEqual(r.Published, want) {
		t.Fatalf("batch with a repeated key = %+v, want %+v", r.Published, want)
	}
	r = h.must(publish(1999, "t", keyed(0, "K", "d")))
	if !reflect.DeepEqual(r.Published, []Published{{1, 0, true}}) {
		t.Fatalf("repeat inside the window = %+v", r.Published)
	}
	if p := parts(t, h.f, "t"); p[0].Count()+p[1].Count() != 2 {
		t.Fatalf("duplicates were stored: %+v", p)
	}
	_ = h.f.View(func(tx *bolt.Tx) error {
		got, ok, err := lookupKey(tx, "t", "K", 1999)
		if err != nil || !ok || got != (Published{1, 0, true}) {
			t.Errorf("lookupKey inside the window = %+v, %v, %v", got, ok, err)
		}
		if _, ok, _ := lookupKey(tx, "t", "K", 2000); ok {
			t.Errorf("lookupKey after the window still finds K")
		}
		return nil
	})
	// The window counts from the first publish: repeats do not extend it.
	r = h.must(publish(2000, "t", keyed(0, "K", "e")))
	if !reflect.DeepEqual(r.Published, []Published{{0, 1, false}}) {
		t.Fatalf("publish after the window = %+v", r.Published)
	}
}

func TestApplyDedupExpire(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{DedupWindowMs: ptr(int64(1000))}})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "gone", Patch: mlog.Patch{DedupWindowMs: ptr(int64(1000))}})
	h.must(publish(1000, "t", keyed(0, "K1", "a"), keyed(0, "K2", "b")))
	h.must(publish(1000, "gone", keyed(0, "K1", "a")))
	h.must(publish(1500, "t", keyed(0, "K3", "c")))
	h.must(&command.Command{Op: command.OpDeleteTopic, Topic: "gone"})
	dueAt := func(now int64) int {
		var n int
		_ = h.f.View(func(tx *bolt.Tx) error {
			due, err := dedup.DueEntries(tx, now, 100)
			if err != nil {
				t.Fatal(err)
			}
			n = len(due)
			return nil
		})
		return n
	}
	if n := dueAt(2000); n != 3 {
		t.Fatalf("due dedup entries at 2000 = %d, want 3 (K1, K2 of t and K1 of the deleted topic)", n)
	}
	h.must(&command.Command{Op: command.OpDedupExpire, Now: 2000, Max: 2})
	if n := dueAt(2000); n != 1 {
		t.Fatalf("after expiring 2 of 3: %d due", n)
	}
	h.must(&command.Command{Op: command.OpDedupExpire, Now: 2000, Max: 100})
	if n := dueAt(1 << 40); n != 1 {
		t.Fatalf("entries left = %d, want only K3's", n)
	}
	_ = h.f.View(func(tx *bolt.Tx) error {
		if _, ok, _ := lookupKey(tx, "t", "K3", 2000); !ok {
			t.Errorf("K3 expired early")
		}
		return nil
	})
}

func TestApplyProducerSequences(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	pub := func(seq uint64, vals ...string) *Result {
		c := &command.Command{Op: command.OpPublish, Now: 1, Topic: "t", Producer: "p1", Seq: seq}
		for _, v := range vals {
			c.Msgs = append(c.Msgs, msg(v))
		}
		return h.apply(c)
	}
	if r := pub(0, "a", "b"); r.Err != nil || !reflect.DeepEqual(r.Published, []Published{{0, 0, false}, {0, 1, false}}) {
		t.Fatalf("seq 0..1 = %+v, %v", r.Published, r.Err)
	}
	if r := pub(1, "b"); r.Err != nil || !reflect.DeepEqual(r.Published, []Published{{0, 1, true}}) {
		t.Fatalf("repeat of seq 1 = %+v, %v", r.Published, r.Err)
	}
	r := pub(5, "x")
	if !errors.Is(r.Err, ErrSeqGap) || r.Expected != 2 {
		t.Fatalf("gap: Err = %v, Expected = %d; want ErrSeqGap, 2", r.Err, r.Expected)
	}
	if r := pub(1, "b", "c"); !errors.Is(r.Err, ErrSeqOverlap) || r.Expected != 2 {
		t.Fatalf("overlap 1..2 (last 1): Err = %v, Expected = %d; want ErrSeqOverlap, 2", r.Err, r.Expected)
	}
	if r := pub(2, "c"); r.Err != nil || !reflect.DeepEqual(r.Published, []Published{{0, 2, false}}) {
		t.Fatalf("seq 2 = %+v, %v", r.Published, r.Err)
	}
	if p := parts(t, h.f, "t")[0]; p.Next != 3 {
		t.Fatalf("stored %d messages, want 3", p.Next)
	}
}

func TestApplySetNode(t *testing.T) {
	h := mustFSM(t)
	n1 := command.NodeInfo{ID: "n1", HTTPAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7101"}
	n2 := command.NodeInfo{ID: "n2", HTTPAddr: "127.0.0.1:7002", RaftAddr: "127.0.0.1:7102"}
	h.must(&command.Command{Op: command.OpSetNode, Node: n1})
	h.must(&command.Command{Op: command.OpSetNode, Node: n2})
	n2.HTTPAddr = "127.0.0.1:8002"
	h.must(&command.Command{Op: command.OpSetNode, Node: n2})
	if got := h.f.Nodes(); !reflect.DeepEqual(got, map[string]command.NodeInfo{"n1": n1, "n2": n2}) {
		t.Fatalf("Nodes = %+v", got)
	}
}

// TestNodeAddressesFollowChanges: Node and Nodes answer from memory
// between changes, and see each change (an address recorded, a restore)
// at once.
func TestNodeAddressesFollowChanges(t *testing.T) {
	h := mustFSM(t)
	if _, ok := h.f.Node("n1"); ok {
		t.Fatal("an empty FSM knows n1")
	}
	n1 := command.NodeInfo{ID: "n1", HTTPAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7101"}
	h.must(&command.Command{Op: command.OpSetNode, Node: n1})
	if got, ok := h.f.Node("n1"); !ok || got != n1 {
		t.Fatalf("Node(n1) = %+v, %v; want %+v", got, ok, n1)
	}
	n1.HTTPAddr = "127.0.0.1:8001"
	h.must(&command.Command{Op: command.OpSetNode, Node: n1})
	if got, _ := h.f.Node("n1"); got != n1 {
		t.Fatalf("after the address changed, Node(n1) = %+v; want %+v", got, n1)
	}
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"}) // no node change: the cache stays
	all := h.f.Nodes()
	delete(all, "n1") // a caller's copy
	if _, ok := h.f.Node("n1"); !ok {
		t.Fatal("changing the map Nodes returned changed the FSM's")
	}

	// A restore replaces the addresses: a snapshot of another FSM that
	// knows n2 only.
	o := mustFSM(t)
	n2 := command.NodeInfo{ID: "n2", HTTPAddr: "127.0.0.1:7002", RaftAddr: "127.0.0.1:7102"}
	o.must(&command.Command{Op: command.OpSetNode, Node: n2})
	o.restoreInto(h)
	if got, ok := h.f.Node("n2"); !ok || got != n2 {
		t.Fatalf("after a restore, Node(n2) = %+v, %v; want %+v", got, ok, n2)
	}
	if got, ok := h.f.Node("n1"); ok {
		t.Fatalf("after a restore without n1, Node(n1) = %+v", got)
	}
}

func TestAppliedIndexTracked(t *testing.T) {
	h := mustFSM(t)
	if h.f.AppliedIndex() != 0 {
		t.Fatalf("fresh FSM AppliedIndex = %d", h.f.AppliedIndex())
	}
	logs := []*raft.Log{
		{Index: 5, Type: raft.LogCommand, Data: (&command.Command{Op: command.OpPutTopic, Topic: "t"}).Encode()},
		{Index: 6, Type: raft.LogNoop},
		{Index: 7, Type: raft.LogConfiguration, Data: []byte("not a command")},
	}
	out := h.f.ApplyBatch(logs)
	if r, ok := out[0].(*Result); !ok || r.Err != nil || !r.Created {
		t.Fatalf("result 0 = %#v", out[0])
	}
	if out[1] != nil || out[2] != nil {
		t.Fatalf("non-command entries gave results %v, %v", out[1], out[2])
	}
	if got := h.f.AppliedIndex(); got != 7 {
		t.Fatalf("AppliedIndex = %d, want 7", got)
	}
	_ = h.f.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktMeta).Get(keyApplied); !bytes.Equal(v, mlog.U64Key(7)) {
			t.Errorf("stored applied index = %x, want 7", v)
		}
		return nil
	})
	// Apply (single entry) tracks it too.
	r := h.f.Apply(&raft.Log{Index: 8, Type: raft.LogCommand, Data: publish(1, "t", msg("a")).Encode()})
	if res, ok := r.(*Result); !ok || res.Err != nil {
		t.Fatalf("Apply = %#v", r)
	}
	if got := h.f.AppliedIndex(); got != 8 {
		t.Fatalf("AppliedIndex after Apply = %d, want 8", got)
	}
}

func TestApplyUndecodableEntryPanics(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t"})
	applied := h.f.AppliedIndex()
	h.mustStopWritingNothing("an undecodable committed entry", func() {
		h.f.ApplyBatch([]*raft.Log{
			{Index: applied + 1, Type: raft.LogCommand, Data: publish(1, "t", msg("a")).Encode()},
			{Index: applied + 2, Type: raft.LogCommand, Data: []byte{0xde, 0xad}},
		})
	})
	if got := h.f.AppliedIndex(); got != applied {
		t.Fatalf("AppliedIndex moved to %d after a failed batch", got)
	}
}

// mustStopWritingNothing checks that apply panics (the node stops) and
// that its batch's transaction was rolled back as a whole.
func (h *harness) mustStopWritingNothing(what string, apply func()) {
	h.t.Helper()
	before := dumpDB(h.t, h.f)
	func() {
		defer func() {
			if recover() == nil {
				h.t.Fatalf("%s did not stop the FSM", what)
			}
		}()
		apply()
	}()
	if after := dumpDB(h.t, h.f); !reflect.DeepEqual(after, before) {
		h.t.Fatalf("%s: the panicking batch left writes behind:\n%s", what, diffDumps(before, after))
	}
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	closed, canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.canceled = true; return nil }
func (s *memSink) Close() error  { s.closed = true; return nil }

var _ raft.SnapshotSink = (*memSink)(nil)

// restoreInto snapshots h's state and restores it into dst.
func (h *harness) restoreInto(dst *harness) {
	h.t.Helper()
	snap, err := h.f.Snapshot()
	if err != nil {
		h.t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		h.t.Fatal(err)
	}
	snap.Release()
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		h.t.Fatal(err)
	}
}

// buildState applies a mix of most kinds of command.
func buildState(h *harness) {
	h.must(&command.Command{Op: command.OpSetNode, Node: command.NodeInfo{ID: "n1", HTTPAddr: "h1", RaftAddr: "r1"}})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "a", Patch: mlog.Patch{Partitions: ptr(uint32(3))}})
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "b", Patch: mlog.Patch{MaxMessages: ptr(int64(4)), Overflow: ptr(mlog.OverflowDropHead)}})
	for i := range 10 {
		p := keyed(uint32(i), fmt.Sprintf("k%d", i%7), fmt.Sprintf("value-%d", i))
		h.must(publish(int64(1000+i), "a", p))
		h.must(publish(int64(1000+i), "b", msg(fmt.Sprint(i))))
	}
	h.must(&command.Command{Op: command.OpPutGroup, Now: 1100, Topic: "a", Group: "idle"})
	ds := h.must(&command.Command{Op: command.OpLease, Now: 1100, Topic: "a", Group: "g1", Max: 5, LeaseMs: 500}).Deliveries
	h.must(&command.Command{Op: command.OpAck, Now: 1200, Topic: "a", Group: "g1", Receipts: receipts(ds)[:2]})
	h.must(&command.Command{Op: command.OpExtend, Now: 1200, Topic: "a", Group: "g1", LeaseMs: 5000, Receipts: receipts(ds)[2:3]})
	h.must(&command.Command{Op: command.OpExpire, Now: 1600, Expired: []group.Expired{{Topic: "a", Group: "g1", Receipt: receipts(ds)[3]}}})
	ds = h.must(&command.Command{Op: command.OpLease, Now: 1700, Topic: "b", Group: "g2", Max: 2, LeaseMs: 500}).Deliveries
	h.must(&command.Command{Op: command.OpNack, Now: 1701, Topic: "b", Group: "g2", Receipts: receipts(ds)[:1], NodeID: "n1",
		Reason: "poison", DelayMs: -1})
	h.must(&command.Command{Op: command.OpNack, Now: 1702, Topic: "b", Group: "g2", Receipts: receipts(ds)[1:], NodeID: "n1",
		Rands: []uint32{7}, Reason: "later", Retryable: true, DelayMs: -1})
}

func TestSnapshotRestore(t *testing.T) {
	h := mustFSM(t)
	buildState(h)
	wantDump := dumpDB(t, h.f)
	wantStats := topicStates(t, h.f, 2000)
	if len(wantDump) < 40 || len(wantStats) != 2 || len(wantStats["a"].Groups) != 2 || wantStats["b"].Groups["g2"].DLQ != 1 {
		t.Fatalf("buildState built too little: %d keys, %+v", len(wantDump), wantStats)
	}
	wantIdx := h.f.AppliedIndex()
	wantNodes := h.f.Nodes()

	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Applies after Snapshot() must not leak into the snapshot.
	later := []*command.Command{
		publish(3000, "a", msg("after-snapshot")),
		{Op: command.OpLease, Now: 3000, Topic: "a", Group: "g1", Max: 100, LeaseMs: 100},
		{Op: command.OpDeleteTopic, Now: 3000, Topic: "b"},
	}
	for _, c := range later {
		h.must(c)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	snap.Release()
	if !sink.closed || sink.canceled {
		t.Fatalf("sink closed=%v canceled=%v, want closed only", sink.closed, sink.canceled)
	}

	r := mustFSM(t)
	r.must(&command.Command{Op: command.OpPutTopic, Topic: "stale-topic"}) // replaced by the restore
	if err := r.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got := r.f.AppliedIndex(); got != wantIdx {
		t.Fatalf("restored AppliedIndex = %d, want %d", got, wantIdx)
	}
	if got := topicStates(t, r.f, 2000); !reflect.DeepEqual(got, wantStats) {
		t.Fatalf("restored topic stats:\n got %+v\nwant %+v", got, wantStats)
	}
	if got := dumpDB(t, r.f); !reflect.DeepEqual(got, wantDump) {
		t.Fatalf("restored state differs:\n%s", diffDumps(got, wantDump))
	}
	if got := r.f.Nodes(); !reflect.DeepEqual(got, wantNodes) {
		t.Fatalf("restored nodes = %+v, want %+v", got, wantNodes)
	}
	if r.notified["a"] == 0 || r.notified["b"] == 0 {
		t.Fatalf("Restore did not notify every topic: %v", r.notified)
	}
	// Replaying the entries after the snapshot gives the original's state.
	r.idx = wantIdx
	for _, c := range later {
		r.must(c)
	}
	if got, want := dumpDB(t, r.f), dumpDB(t, h.f); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored + replayed state differs from the original:\n%s", diffDumps(got, want))
	}
	if got, want := r.f.AppliedIndex(), h.f.AppliedIndex(); got != want {
		t.Fatalf("AppliedIndex %d vs %d", got, want)
	}
}

type failingSink struct{ memSink }

func (s *failingSink) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestSnapshotPersistFailureCancels(t *testing.T) {
	h := mustFSM(t)
	buildState(h)
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	sink := &failingSink{}
	if err := snap.Persist(sink); err == nil {
		t.Fatalf("Persist into a failing sink succeeded")
	}
	if !sink.canceled || sink.closed {
		t.Fatalf("failing sink canceled=%v closed=%v, want canceled only", sink.canceled, sink.closed)
	}
}

func TestDeterministicReplicas(t *testing.T) {
	a, b := mustFSM(t), mustFSM(t)
	buildState(a)
	buildState(b)
	if da, db := dumpDB(t, a.f), dumpDB(t, b.f); !reflect.DeepEqual(da, db) {
		t.Fatalf("two FSMs fed the same log differ:\n%s", diffDumps(da, db))
	}
}

func TestApplyMulti(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{MaxMessages: ptr(int64(2))}})
	r := h.apply(&command.Command{Op: command.OpMulti, Batch: []*command.Command{
		publish(1, "t", msg("a")),
		publish(1, "nope", msg("b")),
		publish(1, "t", msg("c"), msg("d")), // full
		publish(1, "t", msg("e")),
	}})
	if r.Err != nil || len(r.Multi) != 4 {
		t.Fatalf("multi = %+v", r)
	}
	if r.Multi[0].Err != nil || !errors.Is(r.Multi[1].Err, mlog.ErrTopicNotFound) ||
		!errors.Is(r.Multi[2].Err, mlog.ErrTopicFull) || r.Multi[3].Err != nil {
		t.Fatalf("multi errors = %v %v %v %v", r.Multi[0].Err, r.Multi[1].Err, r.Multi[2].Err, r.Multi[3].Err)
	}
	if r.Multi[3].Published[0].Offset != 1 {
		t.Fatalf("last publish at %+v, want offset 1", r.Multi[3].Published)
	}
}

// The state's time never goes back: a command stamped earlier than the
// latest applied one (a new leader whose clock is behind) is applied at
// the latest time, so a lease it grants does not end before the time the
// state already reached; the time survives a snapshot and restore.
func TestFSMTimeMonotonic(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Now: 5000, Topic: "t"})
	if now := h.f.Now(); now != 5000 {
		t.Fatalf("state time %d, want 5000", now)
	}
	h.must(publish(1000, "t", msg("a")))
	if now := h.f.Now(); now != 5000 {
		t.Fatalf("after a command stamped 1000: state time %d, want 5000", now)
	}
	r := h.must(&command.Command{Op: command.OpLease, Now: 2000, Topic: "t", Group: "g", Max: 1, LeaseMs: 1000})
	if len(r.Deliveries) != 1 {
		t.Fatalf("lease: %d deliveries", len(r.Deliveries))
	}
	_ = h.f.View(func(tx *bolt.Tx) error {
		due, err := group.DueLeases(tx, 5999, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) != 0 {
			t.Fatalf("a lease granted by a command stamped 2000 for 1 s is due at 5999: it must run from 5000")
		}
		return nil
	})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 7000, Topic: "t"})
	h2 := mustFSM(t)
	h.restoreInto(h2)
	if now := h2.f.Now(); now != 7000 {
		t.Fatalf("restored state time %d, want 7000", now)
	}
}

// Fetches are group-committed: an OpMulti applies each lease sub-command
// as it would a lone one, in order, at its own time. Two leases of the
// same group in one entry hand out disjoint messages; a refused one fails
// alone; a receipt naming the entry that carries it is invalid (it cannot
// have been handed out yet).
func TestApplyMultiLeases(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "t", Patch: mlog.Patch{Partitions: ptr(uint32(2))}})
	h.must(publish(1, "t", keyed(0, "", "a"), keyed(1, "", "b"), keyed(0, "", "c"), keyed(1, "", "d"), keyed(0, "", "e")))
	entry := h.idx + 1
	r := h.apply(&command.Command{Op: command.OpMulti, Now: 100, Batch: []*command.Command{
		{Op: command.OpLease, Now: 100, Topic: "t", Group: "g", Max: 2, LeaseMs: 1000},
		{Op: command.OpLease, Now: 100, Topic: "nope", Group: "g", Max: 2, LeaseMs: 1000},
		{Op: command.OpLease, Now: 200, Topic: "t", Group: "g", Max: 2, LeaseMs: 5000},
		{Op: command.OpAck, Now: 200, Topic: "t", Group: "g", Receipts: []group.Receipt{{Partition: 0, Offset: 0, Delivery: entry}}},
		{Op: command.OpLease, Now: 300, Topic: "t", Group: "other", Max: 10, LeaseMs: 1000},
		{Op: command.OpLease, Now: 300, Topic: "t", Group: "g", Max: 10, LeaseMs: 1000},
	}})
	if r.Err != nil || len(r.Multi) != 6 {
		t.Fatalf("multi = %+v", r)
	}
	for i, sub := range r.Multi {
		if (i == 1) != (sub.Err != nil) {
			t.Fatalf("sub-command %d: err %v", i, sub.Err)
		}
	}
	if !errors.Is(r.Multi[1].Err, mlog.ErrTopicNotFound) {
		t.Fatalf("lease of a missing topic: %v", r.Multi[1].Err)
	}
	if !reflect.DeepEqual(r.Multi[3].Statuses, []string{group.StatusInvalid}) {
		t.Fatalf("ack naming its own entry's lease = %v, want [invalid]", r.Multi[3].Statuses)
	}
	first, second, rest := r.Multi[0].Deliveries, r.Multi[2].Deliveries, r.Multi[5].Deliveries
	seen := map[[2]uint64]int{}
	for i, ds := range [][]group.Delivery{first, second, rest} {
		for _, d := range ds {
			k := [2]uint64{uint64(d.Partition), d.Offset}
			if j, dup := seen[k]; dup {
				t.Fatalf("message %v handed out by lease %d and lease %d of the same entry", k, j, i)
			}
			seen[k] = i
			if d.Delivery != entry {
				t.Fatalf("delivery id %d, want the entry's index %d", d.Delivery, entry)
			}
		}
	}
	if len(first) != 2 || len(second) != 2 || len(rest) != 1 || len(r.Multi[4].Deliveries) != 5 {
		t.Fatalf("deliveries: g %d, %d, %d; other %d; want 2, 2, 1; 5", len(first), len(second), len(rest), len(r.Multi[4].Deliveries))
	}
	// Each lease runs from its own command's time: the first's end at 1100,
	// the second's at 5200, the last's at 1300.
	due := func(at int64) map[[2]uint64]bool {
		out := map[[2]uint64]bool{}
		_ = h.f.View(func(tx *bolt.Tx) error {
			xs, err := group.DueLeases(tx, at, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range xs {
				if x.Group == "g" {
					out[[2]uint64{uint64(x.Partition), x.Offset}] = true
				}
			}
			return nil
		})
		return out
	}
	want := map[[2]uint64]bool{}
	for _, d := range first {
		want[[2]uint64{uint64(d.Partition), d.Offset}] = true
	}
	if got := due(1100); !reflect.DeepEqual(got, want) {
		t.Fatalf("leases due at 1100 = %v, want the first lease's %v", got, want)
	}
	if got := due(5199); len(got) != 3 {
		t.Fatalf("leases due at 5199 = %v, want the first and the last lease's", got)
	}
	// The receipts work in a later entry.
	if r := h.must(&command.Command{Op: command.OpAck, Now: 400, Topic: "t", Group: "g", Receipts: receipts(second)}); !reflect.DeepEqual(r.Statuses, []string{"ok", "ok"}) {
		t.Fatalf("ack of the second lease later = %v", r.Statuses)
	}
}

// fsm.db holds retained 1 KiB messages in about 1.14 bytes of pages per
// payload byte (8 KiB pages, seven messages each); 4 KiB pages fit three
// and make it 1.34.
func TestFSMPagesHoldPayloadOnce(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
	val := strings.Repeat("v", 1024)
	const total, perBatch = 8192, 64
	for i := 0; i < total; i += perBatch {
		cmds := make([]*command.Command, perBatch)
		for j := range cmds {
			cmds[j] = publish(int64(2+i), "t", msg(val))
		}
		for _, r := range h.batch(cmds...) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		// A batch a second, as checkpointLoop moves the checkpoint: the
		// pages freed meanwhile are reused only after that.
		h.f.mu.RLock()
		if err := h.f.takeCheckpoint(false); err != nil {
			t.Fatal(err)
		}
		h.f.mu.RUnlock()
	}
	var size int64
	if err := h.f.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	ratio := float64(size) / float64(total*len(val))
	t.Logf("fsm.db: %d bytes for %d bytes of payload: %.2f×", size, total*len(val), ratio)
	if ratio > 1.25 {
		t.Errorf("fsm.db holds %.2f× the payload, want ≤ 1.25×", ratio)
	}
}

// fsmFreelistSynced reads fsm.db's newer meta page and reports whether it
// points at a written free list (bbolt's meta: page header 16 bytes, then
// magic, version, page size, flags, root bucket (16), freelist, pgid,
// txid).
func fsmFreelistSynced(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	meta := func(off int) (freelist, txid uint64) {
		m := b[off+16:]
		return binary.LittleEndian.Uint64(m[32:]), binary.LittleEndian.Uint64(m[48:])
	}
	pageSize := int(binary.LittleEndian.Uint32(b[16+8:]))
	f0, t0 := meta(0)
	f1, t1 := meta(pageSize)
	if t1 > t0 {
		f0 = f1
	}
	return f0 != math.MaxUint64
}

// While the free list is small, each commit writes it, so that opening
// fsm.db reads it instead of walking every page of the file; once it is
// large (a big backlog trimmed), commits skip it, and a clean close writes
// it once.
func TestFSMFreelistWrittenWhileSmall(t *testing.T) {
	h := mustFSM(t)
	path := h.f.path
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
	val := strings.Repeat("v", 1024)
	for i := range 20 {
		h.must(publish(int64(2+i), "t", msg(val), msg(val)))
	}
	if !fsmFreelistSynced(t, path) {
		t.Fatalf("after small commits the free list is not written: a restart walks the whole file")
	}
	// 16 MiB of messages, then the topic deleted: about 2000 free pages.
	for i := range 256 {
		cmds := make([]*command.Command, 64)
		for j := range cmds {
			cmds[j] = publish(int64(100+i), "t", msg(val))
		}
		h.batch(cmds...)
	}
	h.must(&command.Command{Op: command.OpDeleteTopic, Now: 1000, Topic: "t"})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1001, Topic: "u"})
	h.must(publish(1002, "u", msg(val)))
	if fsmFreelistSynced(t, path) {
		t.Fatalf("with a large free list the commit still wrote it")
	}
	// A clean close writes it, large or not: the restart after a graceful
	// stop does not walk the file.
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	if !fsmFreelistSynced(t, path) {
		t.Fatalf("after a clean close the large free list is not written")
	}
	f, err := OpenFSM(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if st := f.db.Stats(); st.FreePageN < freelistSyncMax {
		t.Fatalf("reopened with %d free pages, want the %d+ freed before", st.FreePageN, freelistSyncMax)
	}
}

// A Restore does not wait for a snapshot raft is still taking of the state
// it replaces: raft's snapshot goroutine, holding the snapshot, may be
// waiting for raft's main goroutine, which waits for the Restore. The
// snapshot persists the state it began on, and releasing it closes the
// replaced file.
func TestRestoreDoesNotWaitForAnOpenSnapshot(t *testing.T) {
	src := mustFSM(t)
	buildState(src)
	sent := &memSink{}
	s, err := src.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Persist(sent); err != nil {
		t.Fatal(err)
	}
	s.Release()

	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "old-topic"})
	oldDump, oldIdx := dumpDB(t, h.f), h.f.AppliedIndex()
	held, err := h.f.Snapshot() // raft's snapshot goroutine holds this
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.f.Restore(io.NopCloser(bytes.NewReader(sent.Bytes()))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
	case <-time.After(10 * time.Second):
		held.Release() // lets the Restore end, so that the test can
		<-done
		t.Fatal("Restore waited for a snapshot of the replaced state to be released")
	}
	if got, want := h.f.AppliedIndex(), src.f.AppliedIndex(); got != want {
		t.Fatalf("restored AppliedIndex %d, want %d", got, want)
	}
	if got, want := dumpDB(t, h.f), dumpDB(t, src.f); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored state differs:\n%s", diffDumps(got, want))
	}
	// The held snapshot still persists the replaced state.
	late := &memSink{}
	if err := held.Persist(late); err != nil {
		t.Fatalf("Persist after the Restore: %v", err)
	}
	held.Release()
	r := mustFSM(t)
	if err := r.f.Restore(io.NopCloser(bytes.NewReader(late.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if got := dumpDB(t, r.f); r.f.AppliedIndex() != oldIdx || !reflect.DeepEqual(got, oldDump) {
		t.Fatalf("the held snapshot holds index %d (want %d):\n%s", r.f.AppliedIndex(), oldIdx, diffDumps(got, oldDump))
	}
	h.f.held.mu.Lock()
	left := len(h.f.held.open) + len(h.f.held.retired)
	h.f.held.mu.Unlock()
	if left != 0 {
		t.Fatalf("the replaced file is still tracked after its last snapshot was released (%d entries)", left)
	}
}
