package command

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzDecodeCommand from sampleCommands")

func ptr[T any](v T) *T { return &v }

// sampleCommands has one command per op (two for some), every field of the
// op populated, and nothing else set.
func sampleCommands() []*Command {
	return []*Command{
		{Op: OpPutTopic, Now: 1700000000000, Topic: "orders", Patch: mlog.Patch{
			Partitions: ptr(uint32(4)), MaxRetry: ptr(int64(3)), BackoffBaseMs: ptr(int64(100)),
			BackoffMaxMs: ptr(int64(1000)), BackoffJitterMs: ptr(int64(7)), AckTimeoutMs: ptr(int64(500)),
			DedupWindowMs: ptr(int64(60000)), RetentionMs: ptr(int64(3600000)), MaxMessages: ptr(int64(10)),
			MaxBytes: ptr(int64(1 << 20)), Overflow: ptr(mlog.OverflowDropHead), MaxMessageBytes: ptr(int64(4096)),
		}},
		{Op: OpPutTopic, Now: 1, Topic: "t", Patch: mlog.Patch{MaxRetry: ptr(int64(0))}},
		{Op: OpDeleteTopic, Now: 2, Topic: "orders"},
		{Op: OpPublish, Now: 1700000000001, Topic: "orders", Producer: "producer-7", Seq: 1 << 50, Msgs: []mlog.Placed{
			{Partition: 3, Msg: &mlog.Message{
				DeliverAt: 1700000009000, IdempotencyKey: "key-1", MaxRetry: 2, BackoffBaseMs: 10, BackoffJitterMs: -1,
				Attrs: []mlog.Attr{{Name: "a", Value: "1"}, {Name: "b", Value: ""}}, Value: []byte("hello\x00\xff"),
			}},
			{Partition: 0, Msg: &mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte("x")}},
		}},
		{Op: OpLease, Now: -5, Topic: "orders", Group: "billing", Max: 1000, LeaseMs: 30000},
		{Op: OpAck, Now: 3, Topic: "orders", Group: "billing", Receipts: []group.Receipt{
			{Partition: 1, Offset: 2, Delivery: 3}, {Partition: 1<<32 - 1, Offset: 1<<64 - 1, Delivery: 1 << 40},
		}},
		{Op: OpExtend, Now: 4, Topic: "orders", Group: "billing", LeaseMs: 12345, Receipts: []group.Receipt{
			{Partition: 0, Offset: 9, Delivery: 8},
		}},
		{Op: OpExpire, Now: 5, Expired: []group.Expired{
			{Topic: "orders", Group: "billing", Receipt: group.Receipt{Partition: 2, Offset: 5, Delivery: 11}},
			{Topic: "other", Group: "g", Receipt: group.Receipt{Partition: 0, Offset: 0, Delivery: 1}},
		}, NodeID: "n2", Rands: []uint32{0, 1<<32 - 1}},
		{Op: OpPutGroup, Now: 6, Topic: "orders", Group: "shipping"},
		{Op: OpDeleteGroup, Now: 7, Topic: "orders", Group: "shipping"},
		{Op: OpTrim, Now: 8, Topic: "orders"},
		{Op: OpSetNode, Now: 9, Node: NodeInfo{ID: "n1", HTTPAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7101"}},
		{Op: OpDedupExpire, Now: 10, Max: 512},
		{Op: OpNack, Now: 14, Topic: "orders", Group: "billing", Receipts: []group.Receipt{{Partition: 2, Offset: 3, Delivery: 4}},
			NodeID: "n3", Rands: []uint32{12345}, Reason: "bad payload", Retryable: true, DelayMs: -1},
		{Op: OpNack, Now: 15, Topic: "orders", Group: "billing", Receipts: []group.Receipt{{Offset: 1, Delivery: 1}},
			Reason: "", Retryable: false, DelayMs: 2500},
		{Op: OpReplay, Now: 16, Topic: "orders", Group: "billing", IDs: []uint64{1, 2, 1 << 60}, Rate: 50},
		{Op: OpReplay, Now: 17, Topic: "orders", Group: "billing", All: true, Rate: 1},
		{Op: OpReplayStep, Now: 18, Topic: "orders", Group: "billing", Max: 100},
		{Op: OpDeleteDeadLetter, Now: 19, Topic: "orders", Group: "billing", IDs: []uint64{7}},
		{Op: OpMulti, Now: 11, Batch: []*Command{
			{Op: OpPublish, Now: 11, Topic: "orders", Msgs: []mlog.Placed{
				{Partition: 1, Msg: &mlog.Message{MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte("m")}},
			}},
			{Op: OpAck, Now: 12, Topic: "orders", Group: "billing", Receipts: []group.Receipt{{Partition: 1, Offset: 2, Delivery: 3}}},
			{Op: OpExtend, Now: 13, Topic: "orders", Group: "billing", LeaseMs: 5, Receipts: []group.Receipt{{Offset: 7, Delivery: 9}}},
		}},
		{Op: OpSetFormat, Now: 20, Format: 2},
		{Op: OpProcess, Now: 21, Topic: "orders", Group: "billing", Receipts: []group.Receipt{
			{Partition: 1, Offset: 2, Delivery: 3}, {Offset: 4, Delivery: 5},
		}, Outputs: []Output{
			{Topic: "payments", Placed: mlog.Placed{Partition: 2, Msg: &mlog.Message{IdempotencyKey: "pay-1", MaxRetry: -1,
				BackoffBaseMs: -1, BackoffJitterMs: -1, Attrs: []mlog.Attr{{Name: "k", Value: "v"}}, Value: []byte("p")}}},
			{Topic: "audit", Placed: mlog.Placed{Msg: &mlog.Message{MaxRetry: 1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte{}}}},
		}},
		{Op: OpCreateGroup, Now: 22, Group: "g1", Members: []string{"n2", "n3", "n1"}, Replicas: 3},
		{Op: OpCreateGroup, Now: 25, Group: "g2", Members: []string{"n1"}, Replicas: 3},
		{Op: OpPlaceTopic, Now: 23, Topic: "orders", Group: "g1"},
		{Op: OpSetMembers, Now: 24, Group: "g1", Members: []string{"n4", "n3", "n1"}},
	}
}

func TestSampleCommandsCoverEveryOp(t *testing.T) {
	seen := map[Op]bool{}
	for _, c := range sampleCommands() {
		seen[c.Op] = true
	}
	for op := OpInvalid + 1; op < opEnd; op++ {
		if !seen[op] {
			t.Errorf("no sample command for %s: add one (and rerun with -update-corpus)", op)
		}
	}
}

func TestCommandRoundTrip(t *testing.T) {
	for _, c := range sampleCommands() {
		b := c.Encode()
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: decode: %v", c.Op, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("%s: round trip:\n got %s\nwant %s", c.Op, dump(got), dump(c))
		}
		if again := got.Encode(); !bytes.Equal(again, b) {
			t.Fatalf("%s: re-encoding differs:\n%x\n%x", c.Op, again, b)
		}
	}
}

func TestCommandEncodesOnlyItsOpFields(t *testing.T) {
	c := &Command{Op: OpLease, Now: 1, Topic: "t", Group: "g", Max: 2, LeaseMs: 3,
		Receipts: []group.Receipt{{Partition: 1}}, Node: NodeInfo{ID: "x"}, Patch: mlog.Patch{MaxRetry: ptr(int64(1))}}
	got, err := Decode(c.Encode())
	if err != nil {
		t.Fatal(err)
	}
	want := &Command{Op: OpLease, Now: 1, Topic: "t", Group: "g", Max: 2, LeaseMs: 3}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s, want %s", dump(got), dump(want))
	}
}

func TestCommandEmptyLists(t *testing.T) {
	for _, c := range []*Command{
		{Op: OpPublish, Topic: "t"},
		{Op: OpAck, Topic: "t", Group: "g"},
		{Op: OpExpire},
	} {
		got, err := Decode(c.Encode())
		if err != nil {
			t.Fatalf("%s with no items: %v", c.Op, err)
		}
		if len(got.Msgs)+len(got.Receipts)+len(got.Expired) != 0 || got.Topic != c.Topic || got.Group != c.Group {
			t.Fatalf("%s with no items decoded as %s", c.Op, dump(got))
		}
	}
}

func TestDecodeCommandTruncated(t *testing.T) {
	for _, c := range sampleCommands() {
		b := c.Encode()
		for n := 0; n < len(b); n++ {
			got, err := decodeNoPanic(t, b[:n])
			if err == nil {
				t.Fatalf("%s: prefix %d/%d decoded to %s", c.Op, n, len(b), dump(got))
			}
			if !errors.Is(err, mlog.ErrCorrupt) {
				t.Fatalf("%s: prefix %d/%d: err = %v, want ErrCorrupt", c.Op, n, len(b), err)
			}
		}
		// Trailing bytes are refused too.
		if _, err := decodeNoPanic(t, append(bytes.Clone(b), 0)); !errors.Is(err, mlog.ErrCorrupt) {
			t.Fatalf("%s with a trailing byte: err = %v", c.Op, err)
		}
	}
}

func TestDecodeCommandGarbage(t *testing.T) {
	inputs := [][]byte{
		nil,
		{},
		{codecVersion},
		{codecVersion, byte(OpInvalid), 0},
		{codecVersion, byte(opEnd), 0},
		{codecVersion, 0xff, 0},
		{codecVersion + 1, byte(OpTrim), 0, 1, 't'},
		{0, byte(OpTrim), 0, 1, 't'},
		// A publish claiming 2^63 messages in a few bytes.
		append([]byte{codecVersion, byte(OpPublish), 0, 1, 't', 0, 0}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
		// Receipts count far beyond the input.
		{codecVersion, byte(OpAck), 0, 1, 't', 1, 'g', 0, 0xff, 0xff, 0x03, 1, 2, 3},
		// An expire item with two receipts.
		{codecVersion, byte(OpExpire), 0, 1, 1, 't', 1, 'g', 2, 0, 0, 0, 0, 0, 0},
		// An expire item with no receipt.
		{codecVersion, byte(OpExpire), 0, 1, 1, 't', 1, 'g', 0, 0, 0, 0},
		// A string length larger than the input.
		{codecVersion, byte(OpDeleteTopic), 0, 100, 'a'},
		// A publish message with a bad message version.
		{codecVersion, byte(OpPublish), 0, 1, 't', 0, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0},
		// A producer id longer than the input.
		{codecVersion, byte(OpPublish), 0, 1, 't', 9, 'p', 0, 0},
		bytes.Repeat([]byte{0xff}, 64),
		// A multi nested in a multi.
		{codecVersion, byte(OpMulti), 0, 1, 4, codecVersion, byte(OpMulti), 0, 0},
		// A multi whose command is cut short.
		{codecVersion, byte(OpMulti), 0, 1, 5, codecVersion, byte(OpTrim), 0, 3, 'a'},
		// A multi whose command length runs past the input.
		{codecVersion, byte(OpMulti), 0, 1, 9, codecVersion, byte(OpTrim), 0, 0},
		// A multi holding an undecodable command.
		{codecVersion, byte(OpMulti), 0, 1, 3, codecVersion, 0xee, 0},
	}
	for _, in := range inputs {
		got, err := decodeNoPanic(t, in)
		if err == nil {
			t.Errorf("Decode(%x) = %s, want an error", in, dump(got))
			continue
		}
		if got != nil {
			t.Errorf("Decode(%x) returned a command with error %v", in, err)
		}
		if !errors.Is(err, mlog.ErrCorrupt) {
			t.Errorf("Decode(%x): err = %v, want ErrCorrupt", in, err)
		}
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[Op]string{OpInvalid: "invalid", OpPublish: "publish", OpSetNode: "set_node",
		OpDedupExpire: "dedup_expire", OpSetFormat: "set_format", opEnd: fmt.Sprintf("op(%d)", byte(opEnd)), 200: "op(200)"} {
		if got := op.String(); got != want {
			t.Errorf("Op(%d).String() = %q, want %q", byte(op), got, want)
		}
	}
	for op := OpInvalid; op < opEnd; op++ {
		if strings.HasPrefix(op.String(), "op(") {
			t.Errorf("Op(%d) has no name", byte(op))
		}
	}
	// Op values are part of the replicated log: they must never move.
	fixed := map[Op]byte{OpInvalid: 0, OpPutTopic: 1, OpDeleteTopic: 2, OpPublish: 3, OpLease: 4, OpAck: 5, OpExtend: 6,
		OpExpire: 7, OpPutGroup: 8, OpDeleteGroup: 9, OpTrim: 10, OpSetNode: 11, OpDedupExpire: 12, OpMulti: 13,
		OpNack: 14, OpReplay: 15, OpReplayStep: 16, OpDeleteDeadLetter: 17, OpSetFormat: 18}
	for op, v := range fixed {
		if byte(op) != v {
			t.Errorf("%s = %d, was %d: ops are only appended", op, byte(op), v)
		}
	}
}

func decodeNoPanic(t testing.TB, b []byte) (c *Command, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Decode(%x) panicked: %v", b, r)
		}
	}()
	return Decode(b)
}

// dump prints a command with its pointers followed.
func dump(c *Command) string {
	if c == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{Op:%s Now:%d Topic:%q Group:%q Producer:%q Seq:%d Max:%d LeaseMs:%d Receipts:%+v Expired:%+v Node:%+v NodeID:%q Rands:%v Reason:%q Retryable:%v DelayMs:%d IDs:%v All:%v Rate:%d Format:%d Patch:%s Batch:%d Msgs:[",
		c.Op, c.Now, c.Topic, c.Group, c.Producer, c.Seq, c.Max, c.LeaseMs, c.Receipts, c.Expired, c.Node, c.NodeID, c.Rands, c.Reason, c.Retryable, c.DelayMs, c.IDs, c.All, c.Rate, c.Format, patchString(c.Patch), len(c.Batch))
	for _, m := range c.Msgs {
		fmt.Fprintf(&b, "{p%d %+v}", m.Partition, m.Msg)
	}
	b.WriteString("]")
	for _, sub := range c.Batch {
		b.WriteString(" " + dump(sub))
	}
	b.WriteString("}")
	return b.String()
}

func patchString(p mlog.Patch) string {
	v := reflect.ValueOf(p)
	var parts []string
	for i := range v.NumField() {
		if f := v.Field(i); !f.IsNil() {
			parts = append(parts, fmt.Sprintf("%s=%v", v.Type().Field(i).Name, f.Elem().Interface()))
		}
	}
	return "{" + strings.Join(parts, " ") + "}"
}

const corpusDir = "testdata/fuzz/FuzzDecodeCommand"

// corpusFile renders b in the `go test fuzz v1` corpus file format.
func corpusFile(b []byte) string {
	return "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
}

// TestFuzzSeedCorpus keeps the committed seed corpus in step with
// sampleCommands: every sample has its file, and every file is a valid
// corpus entry that decodes. Run with -update-corpus to rewrite it.
func TestFuzzSeedCorpus(t *testing.T) {
	want := map[string]string{}
	for i, c := range sampleCommands() {
		want[fmt.Sprintf("seed-%02d-%s", i, c.Op)] = corpusFile(c.Encode())
	}
	if *updateCorpus {
		if err := os.MkdirAll(corpusDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range want {
			if err := os.WriteFile(filepath.Join(corpusDir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, content := range want {
		got, err := os.ReadFile(filepath.Join(corpusDir, name))
		if err != nil {
			t.Fatalf("seed corpus: %v (run go test -run TestFuzzSeedCorpus -update-corpus ./raftfsm/)", err)
		}
		if string(got) != content {
			t.Fatalf("seed corpus file %s is out of date (run with -update-corpus)", name)
		}
	}
	entries, err := os.ReadDir(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(corpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(strings.TrimSuffix(string(b), "\n"), "\n", 2)
		if len(lines) != 2 || lines[0] != "go test fuzz v1" ||
			!strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
			t.Fatalf("%s is not a go test fuzz v1 file with one []byte value", e.Name())
		}
		if _, ok := want[e.Name()]; !ok {
			continue // a crasher or a hand-written seed: it only needs to be well formed
		}
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		if _, err := Decode([]byte(s)); err != nil {
			t.Fatalf("seed %s does not decode: %v", e.Name(), err)
		}
	}
}

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range sampleCommands() {
		f.Add(c.Encode())
	}
	f.Add([]byte{})
	f.Add([]byte{codecVersion, byte(OpExpire), 0, 1, 1, 't', 1, 'g', 2, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Decode(b)
		if err != nil {
			if c != nil {
				t.Fatalf("command returned with error %v", err)
			}
			if !errors.Is(err, mlog.ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if c.Op == OpInvalid || c.Op >= opEnd {
			t.Fatalf("decoded a command with op %s", c.Op)
		}
		enc := c.Encode()
		again, err := Decode(enc)
		if err != nil {
			t.Fatalf("re-encoded command does not decode: %v\n%s", err, dump(c))
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("re-encode changed the command:\n%s\n%s", dump(c), dump(again))
		}
		if !bytes.Equal(again.Encode(), enc) {
			t.Fatalf("encoding is not stable")
		}
	})
}

// EncodeMulti frames already encoded commands (the batcher's path) into
// an OpMulti that decodes to those commands, with its own time.
func TestEncodeMulti(t *testing.T) {
	subs := []*Command{
		{Op: OpPublish, Now: 5, Topic: "t", Msgs: []mlog.Placed{{Partition: 1, Msg: &mlog.Message{Value: []byte("v"), MaxRetry: -1}}}},
		{Op: OpAck, Now: 6, Topic: "t", Group: "g", Receipts: []group.Receipt{{Partition: 1, Offset: 2, Delivery: 3}}},
	}
	var enc [][]byte
	for _, c := range subs {
		enc = append(enc, c.Encode())
	}
	got, err := Decode(EncodeMulti(7, enc))
	if err != nil {
		t.Fatal(err)
	}
	if got.Op != OpMulti || got.Now != 7 || len(got.Batch) != len(subs) {
		t.Fatalf("decoded %s now %d with %d commands, want multi now 7 with %d", got.Op, got.Now, len(got.Batch), len(subs))
	}
	for i, sub := range got.Batch {
		if !bytes.Equal(sub.Encode(), enc[i]) {
			t.Errorf("command %d decodes as %+v, want %+v", i, sub, subs[i])
		}
	}
}
