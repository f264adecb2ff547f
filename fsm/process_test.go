package fsm

import (
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// processSetup makes topics in (2 partitions), out and audit, in state
// format 3, publishes two keyed messages to in and leases them to group g.
func processSetup(t *testing.T, h *harness, format uint32) []group.Receipt {
	t.Helper()
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1000, Format: format})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1000, Topic: "in", Patch: mlog.Patch{Partitions: ptr(uint32(2)), DedupWindowMs: ptr(int64(60000))}})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1000, Topic: "out", Patch: mlog.Patch{MaxMessageBytes: ptr(int64(100))}})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1000, Topic: "audit", Patch: mlog.Patch{MaxMessages: ptr(int64(3))}})
	h.must(publish(1001, "in", keyed(0, "order-1", "a"), keyed(1, "order-2", "b")))
	r := h.must(&command.Command{Op: command.OpLease, Now: 1002, Topic: "in", Group: "g", Max: 10, LeaseMs: 30000})
	if len(r.Deliveries) != 2 {
		t.Fatalf("leased %d, want 2", len(r.Deliveries))
	}
	return receipts(r.Deliveries)
}

func out(topic, key, v string) command.Output {
	m := msg(v)
	m.Msg.IdempotencyKey = key
	return command.Output{Topic: topic, Placed: m}
}

func processCmd(now int64, rs []group.Receipt, outs ...command.Output) *command.Command {
	return &command.Command{Op: command.OpProcess, Now: now, Topic: "in", Group: "g", Receipts: rs, Outputs: outs}
}

func TestApplyProcessAcksAndPublishesOnce(t *testing.T) {
	h := mustFSM(t)
	rs := processSetup(t, h, ProcessFormat)
	c := processCmd(1003, rs, out("out", "pay-1", "p1"), out("audit", "", "x"), out("out", "pay-1", "again"), out("out", "pay-2", "p2"))
	r := h.must(c)
	want := &ProcessResult{Acked: 2, Outputs: []OutputPlacement{
		{"out", Published{0, 0, false}}, {"audit", Published{0, 0, false}},
		{"out", Published{0, 0, true}}, {"out", Published{0, 1, false}},
	}}
	if !reflect.DeepEqual(r.Process, want) {
		t.Fatalf("process = %+v, want %+v", r.Process, want)
	}
	st := topicStates(t, h.f, 1003)
	if g := st["in"].Groups["g"]; g.Acked != 2 || g.InFlight != 0 {
		t.Fatalf("input group after process: %+v", g)
	}
	if n := st["out"].Parts[0].Next; n != 2 {
		t.Fatalf("out holds %d messages, want 2", n)
	}
	// The same call again (a retry after a lost answer): the first one's
	// answer, duplicate, and nothing written but the applied index.
	before := dumpDB(t, h.f)
	again := h.must(processCmd(1500, rs, c.Outputs...))
	want.Duplicate = true
	if !reflect.DeepEqual(again.Process, want) {
		t.Fatalf("repeat = %+v, want %+v", again.Process, want)
	}
	if after := dumpDB(t, h.f); !reflect.DeepEqual(before, after) {
		t.Fatalf("a repeated process changed the state:\n%s", diffDumps(before, after))
	}
	// A call with only one of the receipts is not that call: refused.
	part := h.apply(processCmd(1501, rs[:1], out("out", "", "z")))
	if !errors.Is(part.Err, ErrStaleReceipt) || part.Statuses[0] != group.StatusStale {
		t.Fatalf("subset of an earlier call's receipts: %+v, want stale_receipt", part)
	}
}

// Every refusal comes before the first write: stale or invalid receipts,
// an unknown output topic, an output over max_message_bytes, a full
// output topic, a state format before 3. The receipts stay good.
func TestApplyProcessRefusesWholly(t *testing.T) {
	h := mustFSM(t)
	rs := processSetup(t, h, ProcessFormat)
	stale := append([]group.Receipt{}, rs...)
	stale[1].Delivery--
	big := out("out", "", string(make([]byte, 101)))
	cases := []struct {
		name string
		c    *command.Command
		want error
	}{
		{"stale receipt", processCmd(1003, stale, out("out", "", "x")), ErrStaleReceipt},
		{"receipt twice", processCmd(1003, []group.Receipt{rs[0], rs[0]}, out("out", "", "x")), ErrStaleReceipt},
		{"unknown output topic", processCmd(1003, rs, out("out", "", "x"), out("nope", "", "y")), mlog.ErrTopicNotFound},
		{"oversized output", processCmd(1003, rs, out("audit", "", "x"), big), mlog.ErrTooLarge},
		{"output topic full", processCmd(1003, rs, out("out", "", "x"), out("audit", "", "1"), out("audit", "", "2"),
			out("audit", "", "3"), out("audit", "", "4")), mlog.ErrTopicFull},
		{"unknown group", &command.Command{Op: command.OpProcess, Now: 1003, Topic: "in", Group: "h", Receipts: rs}, group.ErrGroupNotFound},
	}
	for _, tc := range cases {
		before := dumpDB(t, h.f)
		r := h.apply(tc.c)
		if !errors.Is(r.Err, tc.want) {
			t.Fatalf("%s: err %v, want %v", tc.name, r.Err, tc.want)
		}
		if after := dumpDB(t, h.f); !reflect.DeepEqual(before, after) {
			t.Fatalf("%s: the refused process wrote:\n%s", tc.name, diffDumps(before, after))
		}
	}
	if r := h.apply(processCmd(1003, stale, out("out", "", "x"))); r.Statuses[0] != group.StatusOK || r.Statuses[1] != group.StatusStale {
		t.Fatalf("stale statuses %v, want [ok stale]", r.Statuses)
	}
	if r := h.must(processCmd(1004, rs, out("out", "", "x"))); r.Process.Acked != 2 {
		t.Fatalf("after the refusals: %+v", r.Process)
	}

	old := mustFSM(t)
	rs = processSetup(t, old, 2)
	if r := old.apply(processCmd(1003, rs)); !errors.Is(r.Err, ErrFormatTooOld) {
		t.Fatalf("process in state format 2: %v, want ErrFormatTooOld", r.Err)
	}
}

// Another consumer's process after the lease expired: the first
// consumer's late call is stale (its lease is gone), the second one's
// outputs exist once, and its repeat is answered duplicate.
func TestApplyProcessAfterLeaseExpired(t *testing.T) {
	h := mustFSM(t)
	rs := processSetup(t, h, ProcessFormat)
	h.must(&command.Command{Op: command.OpExpire, Now: 40000, Expired: []group.Expired{
		{Topic: "in", Group: "g", Receipt: rs[0]}, {Topic: "in", Group: "g", Receipt: rs[1]}}})
	r := h.must(&command.Command{Op: command.OpLease, Now: 60000, Topic: "in", Group: "g", Max: 10, LeaseMs: 30000})
	second := receipts(r.Deliveries)
	if len(second) != 2 {
		t.Fatalf("redelivered %d, want 2", len(second))
	}
	b := h.must(processCmd(60001, second, out("out", "pay-1", "by B")))
	if a := h.apply(processCmd(60002, rs, out("out", "pay-1", "by A"))); !errors.Is(a.Err, ErrStaleReceipt) {
		t.Fatalf("late call of the first consumer: %+v, want stale_receipt", a)
	}
	again := h.must(processCmd(60003, second, out("out", "pay-1", "by B")))
	if !again.Process.Duplicate || !reflect.DeepEqual(again.Process.Outputs, b.Process.Outputs) {
		t.Fatalf("repeat of B: %+v, want duplicate of %+v", again.Process, b.Process)
	}
	if n := parts(t, h.f, "out")[0].Next; n != 1 {
		t.Fatalf("out holds %d messages, want 1", n)
	}
}

// An outcome lives for the input topic's dedup window: dedup expiry
// removes it (and every entry it kept), and a repeat after that is stale.
func TestApplyProcessOutcomeExpires(t *testing.T) {
	h := mustFSM(t)
	rs := processSetup(t, h, ProcessFormat)
	h.must(processCmd(1003, rs, out("out", "", "x")))
	h.must(&command.Command{Op: command.OpDedupExpire, Now: 1003 + 60001, Max: 2048})
	if r := h.apply(processCmd(1003+60002, rs, out("out", "", "x"))); !errors.Is(r.Err, ErrStaleReceipt) {
		t.Fatalf("repeat after the window: %+v, want stale_receipt", r)
	}
	for k := range dumpDB(t, h.f) {
		if contains(k, "/"+hexOf("po")+"/") || contains(k, "/"+hexOf("pr")+"/") || contains(k, "dedup_expiry") {
			t.Fatalf("left after expiry: %s", k)
		}
	}
}

// Replicas decide alike whatever the raft batches: one FSM applies each
// command in a batch of its own, another everything in one batch, a third
// restored from a snapshot taken after the first call; their states are
// identical. A fourth packs the commands in OpMulti entries (another log).
func TestApplyProcessDeterministicAcrossBatches(t *testing.T) {
	run := func(h *harness, mode int) {
		rs := processSetup(t, h, ProcessFormat)
		cmds := []*command.Command{
			processCmd(1003, rs[:1], out("out", "pay-1", "a"), out("audit", "", "x")),
			processCmd(1004, rs[1:], out("out", "pay-1", "dup"), out("in", "order-3", "c")),
			processCmd(1005, rs[:1], out("out", "pay-1", "a"), out("audit", "", "x")),
			publish(1006, "out", keyed(0, "pay-1", "again")),
		}
		switch mode {
		case 0:
			for _, c := range cmds {
				h.apply(c)
			}
		case 1:
			h.batch(cmds...)
		case 3: // a replica that gets a snapshot after the first call
			h.apply(cmds[0])
			fresh := mustFSM(t)
			h.restoreInto(fresh)
			fresh.idx = h.idx
			*h = *fresh
			h.batch(cmds[1:]...)
		default:
			h.apply(&command.Command{Op: command.OpMulti, Now: 1003, Batch: cmds[:2]})
			h.apply(&command.Command{Op: command.OpMulti, Now: 1005, Batch: cmds[2:]})
		}
	}
	a, b, c, d := mustFSM(t), mustFSM(t), mustFSM(t), mustFSM(t)
	run(a, 0)
	run(b, 1)
	run(c, 2)
	run(d, 3)
	da, db, dc := dumpDB(t, a.f), dumpDB(t, b.f), dumpDB(t, c.f)
	if !reflect.DeepEqual(da, db) {
		t.Fatalf("one batch vs one entry each:\n%s", diffDumps(da, db))
	}
	if dd := dumpDB(t, d.f); !reflect.DeepEqual(da, dd) {
		t.Fatalf("restored from a snapshot mid-way vs one entry each:\n%s", diffDumps(da, dd))
	}
	// OpMulti puts two commands at one raft index: the outcome keys hold
	// the index, so they differ there, and only there.
	if len(da) != len(dc) {
		t.Fatalf("multi vs one entry each: %d keys vs %d", len(dc), len(da))
	}
	for k, v := range dc {
		if contains(k, "/"+hexOf("po")+"/") || contains(k, "/"+hexOf("pr")+"/") || contains(k, "dedup_expiry/") {
			continue
		}
		if da[k] != v {
			t.Fatalf("multi vs one entry each differ at %s", k)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// Keyless messages are leased under range records (spans): process acks
// them there like an ack does, and leaves the others of the span leased.
func TestApplyProcessSpanLeases(t *testing.T) {
	h := mustFSM(t)
	h.must(&command.Command{Op: command.OpSetFormat, Now: 1000, Format: ProcessFormat})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1000, Topic: "in"})
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1000, Topic: "out"})
	h.must(publish(1001, "in", msg("a"), msg("b"), msg("c")))
	rs := receipts(h.must(&command.Command{Op: command.OpLease, Now: 1002, Topic: "in", Group: "g", Max: 10, LeaseMs: 30000}).Deliveries)
	if len(rs) != 3 {
		t.Fatalf("leased %d", len(rs))
	}
	h.must(&command.Command{Op: command.OpProcess, Now: 1003, Topic: "in", Group: "g", Receipts: rs[:2], Outputs: []command.Output{out("out", "", "x")}})
	if g := topicStates(t, h.f, 1003)["in"].Groups["g"]; g.Acked != 2 || g.InFlight != 1 {
		t.Fatalf("after processing 2 of a span of 3: %+v", g)
	}
	if r := h.must(&command.Command{Op: command.OpProcess, Now: 1004, Topic: "in", Group: "g", Receipts: rs[:2]}); !r.Process.Duplicate {
		t.Fatalf("repeat: %+v", r.Process)
	}
	if r := h.must(&command.Command{Op: command.OpAck, Now: 1005, Topic: "in", Group: "g", Receipts: rs}); !reflect.DeepEqual(r.Statuses, []string{"stale", "stale", "ok"}) {
		t.Fatalf("ack after process: %v", r.Statuses)
	}
}
