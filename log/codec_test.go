package log

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestEncDecRoundTrip(t *testing.T) {
	var e Enc
	u64s := []uint64{0, 1, 127, 128, 300, 1<<32 - 1, 1 << 32, math.MaxUint64}
	i64s := []int64{0, 1, -1, 63, -64, 64, -65, math.MaxInt64, math.MinInt64}
	for _, v := range u64s {
		e.U64(v)
	}
	for _, v := range i64s {
		e.I64(v)
	}
	e.Byte(0xfe)
	e.Bool(true)
	e.Bool(false)
	e.Bytes([]byte("payload\x00bytes"))
	e.Bytes(nil)
	e.Str("héllo")
	e.Str("")

	d := Dec{B: e.B}
	for _, want := range u64s {
		if got := d.U64(); got != want {
			t.Fatalf("U64 = %d, want %d", got, want)
		}
	}
	for _, want := range i64s {
		if got := d.I64(); got != want {
			t.Fatalf("I64 = %d, want %d", got, want)
		}
	}
	if got := d.Byte(); got != 0xfe {
		t.Fatalf("Byte = %#x, want 0xfe", got)
	}
	if !d.Bool() || d.Bool() {
		t.Fatalf("Bool round trip failed")
	}
	if got := d.Bytes(); !bytes.Equal(got, []byte("payload\x00bytes")) {
		t.Fatalf("Bytes = %q", got)
	}
	if got := d.Bytes(); len(got) != 0 {
		t.Fatalf("empty Bytes = %q", got)
	}
	if got := d.Str(); got != "héllo" {
		t.Fatalf("Str = %q", got)
	}
	if got := d.Str(); got != "" {
		t.Fatalf("empty Str = %q", got)
	}
	if err := d.Err(); err != nil {
		t.Fatalf("Err = %v", err)
	}
	if len(d.B) != 0 {
		t.Fatalf("%d bytes left over", len(d.B))
	}
}

func TestDecBytesCapIsLimited(t *testing.T) {
	var e Enc
	e.Bytes([]byte("ab"))
	e.Byte('z')
	d := Dec{B: e.B}
	b := d.Bytes()
	if cap(b) != 2 {
		t.Fatalf("cap = %d, want 2 (appending must not overwrite the input)", cap(b))
	}
}

func TestDecTruncatedInputs(t *testing.T) {
	var e Enc
	e.U64(math.MaxUint64)
	e.I64(math.MinInt64)
	e.Byte(7)
	e.Str("a string of some length")
	full := e.B
	read := func(d *Dec) {
		d.U64()
		d.I64()
		d.Byte()
		d.Str()
	}
	for n := 0; n < len(full); n++ {
		d := Dec{B: full[:n]}
		read(&d)
		if !errors.Is(d.Err(), ErrCorrupt) {
			t.Fatalf("prefix of %d/%d bytes: Err = %v, want ErrCorrupt", n, len(full), d.Err())
		}
	}
	d := Dec{B: full}
	read(&d)
	if d.Err() != nil {
		t.Fatalf("full input: %v", d.Err())
	}
}

func TestDecErrorSticks(t *testing.T) {
	d := Dec{B: []byte{0x80}} // an unterminated varint
	if v := d.U64(); v != 0 {
		t.Fatalf("U64 on bad input = %d", v)
	}
	first := d.Err()
	if !errors.Is(first, ErrCorrupt) {
		t.Fatalf("Err = %v", first)
	}
	d.B = []byte{5, 5, 5} // even with input again, reads stay zero
	if d.U64() != 0 || d.I64() != 0 || d.Byte() != 0 || d.Bool() || d.Bytes() != nil || d.Str() != "" || d.Len(1) != 0 {
		t.Fatalf("reads after an error must return zero values")
	}
	if d.Err() != first {
		t.Fatalf("first error replaced: %v", d.Err())
	}
}

func TestDecVarintOverflow(t *testing.T) {
	// 11 continuation bytes overflow a uint64.
	b := bytes.Repeat([]byte{0xff}, 11)
	d := Dec{B: b}
	d.U64()
	if !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("U64 overflow: Err = %v", d.Err())
	}
	d = Dec{B: b}
	d.I64()
	if !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("I64 overflow: Err = %v", d.Err())
	}
}

func TestDecBytesLengthBeyondInput(t *testing.T) {
	var e Enc
	e.U64(1 << 40)
	e.B = append(e.B, "short"...)
	d := Dec{B: e.B}
	if b := d.Bytes(); b != nil {
		t.Fatalf("Bytes = %q, want nil", b)
	}
	if !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("Err = %v", d.Err())
	}
}

func TestDecLen(t *testing.T) {
	var e Enc
	e.U64(3)
	e.B = append(e.B, make([]byte, 6)...)
	d := Dec{B: e.B}
	if n := d.Len(2); n != 3 || d.Err() != nil {
		t.Fatalf("Len(2) = %d, %v; want 3", n, d.Err())
	}
	d = Dec{B: e.B}
	if n := d.Len(3); n != 0 || !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("Len(3) over 6 bytes = %d, %v; want a count error", n, d.Err())
	}
	// A huge count never turns into a huge allocation.
	var h Enc
	h.U64(math.MaxUint64)
	d = Dec{B: h.B}
	if n := d.Len(0); n != 0 || !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("Len(0) of a huge count = %d, %v", n, d.Err())
	}
}

func TestKeysSortNumerically(t *testing.T) {
	if !bytes.Equal(U64Key(0x0102030405060708), []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("U64Key is not big-endian: %x", U64Key(0x0102030405060708))
	}
	if !bytes.Equal(PartKey(0x01020304), []byte{1, 2, 3, 4}) {
		t.Fatalf("PartKey is not big-endian: %x", PartKey(0x01020304))
	}
	vals := []uint64{0, 1, 255, 256, 1 << 40, math.MaxUint64}
	for i := 1; i < len(vals); i++ {
		if bytes.Compare(U64Key(vals[i-1]), U64Key(vals[i])) >= 0 {
			t.Fatalf("U64Key(%d) does not sort before U64Key(%d)", vals[i-1], vals[i])
		}
	}
}

func sampleMessage() *Message {
	return &Message{
		PublishedAt:     1700000000123,
		DeliverAt:       1700000005000,
		IdempotencyKey:  "order-42",
		MaxRetry:        3,
		BackoffBaseMs:   -1,
		BackoffJitterMs: 250,
		Attrs:           []Attr{{"color", "red"}, {"", ""}, {"k", "v\x00w"}},
		Value:           []byte("hello\x00world"),
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []*Message{sampleMessage(), {MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: []byte{}}} {
		got, err := decodeMessage(m.encode())
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if len(m.Attrs) == 0 {
			m.Attrs = nil
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
		}
	}
}

func TestMessageTruncatedAndBadVersion(t *testing.T) {
	full := sampleMessage().encode()
	for n := 0; n < len(full); n++ {
		if _, err := decodeMessage(full[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix %d/%d: err = %v, want ErrCorrupt", n, len(full), err)
		}
	}
	bad := bytes.Clone(full)
	bad[0] = messageVersion + 1
	if _, err := decodeMessage(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad version: err = %v", err)
	}
}

func TestMessageClone(t *testing.T) {
	m := sampleMessage()
	c := m.Clone()
	c.Value[0] = 'X'
	c.Attrs[0].Value = "blue"
	if m.Value[0] != 'h' || m.Attrs[0].Value != "red" {
		t.Fatalf("Clone shares memory with the original")
	}
}

func ptr[T any](v T) *T { return &v }

func TestPatchRoundTrip(t *testing.T) {
	full := Patch{
		Partitions: ptr(uint32(7)), MaxRetry: ptr(int64(9)), BackoffBaseMs: ptr(int64(10)),
		BackoffMaxMs: ptr(int64(11)), BackoffJitterMs: ptr(int64(12)), AckTimeoutMs: ptr(int64(13)),
		DedupWindowMs: ptr(int64(14)), RetentionMs: ptr(int64(15)), MaxMessages: ptr(int64(16)),
		MaxBytes: ptr(int64(17)), Overflow: ptr(OverflowDropHead), MaxMessageBytes: ptr(int64(18)),
	}
	for _, p := range []Patch{{}, full, {MaxBytes: ptr(int64(-5)), Overflow: ptr("")}, {Partitions: ptr(uint32(0))}} {
		var e Enc
		p.Encode(&e)
		d := Dec{B: e.B}
		got := DecodePatch(&d)
		if d.Err() != nil || len(d.B) != 0 {
			t.Fatalf("decode: err %v, %d bytes left", d.Err(), len(d.B))
		}
		if !reflect.DeepEqual(got, p) {
			t.Fatalf("patch round trip:\n got %+v\nwant %+v", got, p)
		}
		// Applying either gives the same config.
		if p.Apply(DefaultConfig()) != got.Apply(DefaultConfig()) {
			t.Fatalf("decoded patch applies differently")
		}
	}
	var e Enc
	full.Encode(&e)
	for n := 0; n < len(e.B); n++ {
		d := Dec{B: e.B[:n]}
		DecodePatch(&d)
		if !errors.Is(d.Err(), ErrCorrupt) {
			t.Fatalf("patch prefix %d/%d: err = %v", n, len(e.B), d.Err())
		}
	}
}

func TestPatchApply(t *testing.T) {
	base := DefaultConfig()
	got := (&Patch{MaxRetry: ptr(int64(0)), Overflow: ptr(OverflowDropHead)}).Apply(base)
	want := base
	want.MaxRetry = 0
	want.Overflow = OverflowDropHead
	if got != want {
		t.Fatalf("Apply = %+v, want %+v", got, want)
	}
	if (&Patch{}).Apply(base) != base {
		t.Fatalf("empty patch changed the config")
	}
}

func TestConfigCodec(t *testing.T) {
	c := Config{Partitions: 12, MaxRetry: 1, BackoffBaseMs: 2, BackoffMaxMs: 3, BackoffJitterMs: 4, AckTimeoutMs: 5,
		DedupWindowMs: 6, RetentionMs: 7, MaxMessages: 8, MaxBytes: 9, Overflow: OverflowDropHead, MaxMessageBytes: 10}
	b := encodeConfig(c)
	got, err := decodeConfig(b)
	if err != nil || got != c {
		t.Fatalf("config round trip = %+v, %v; want %+v", got, err, c)
	}
	for n := 0; n < len(b); n++ {
		if _, err := decodeConfig(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("config prefix %d/%d: err = %v", n, len(b), err)
		}
	}
	if _, err := decodeConfig(nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("nil config: err = %v", err)
	}
}

func TestMetaCodec(t *testing.T) {
	m := PartitionMeta{First: 5, Next: 1 << 33, Bytes: 99}
	got, err := decodeMeta(encodeMeta(m))
	if err != nil || got != m {
		t.Fatalf("meta round trip = %+v, %v", got, err)
	}
	if got.Count() != 1<<33-5 {
		t.Fatalf("Count = %d", got.Count())
	}
	if _, err := decodeMeta([]byte{1, 2}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short meta: err = %v", err)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add(sampleMessage().encode())
	f.Add([]byte{})
	f.Add([]byte{messageVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		again, err := decodeMessage(m.encode())
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("re-encode changed the message:\n%+v\n%+v", m, again)
		}
	})
}
