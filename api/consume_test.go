package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
)

// fetchedJSON is one delivery as the fetch answer shows it, through the
// fetchedMessage struct: the reference appendFetched is held to.
func fetchedJSON(topic, grp string, d group.Delivery) fetchedMessage {
	m := d.Msg
	return fetchedMessage{
		Topic: topic, Partition: d.Partition, Offset: d.Offset,
		Receipt:        group.Receipt{Partition: d.Partition, Offset: d.Offset, Delivery: d.Delivery}.Encode(topic, grp),
		ValueB64:       base64.StdEncoding.EncodeToString(m.Value),
		IdempotencyKey: m.IdempotencyKey, RetryCount: d.RetryCount, MaxRetry: m.MaxRetry,
		PublishedAt: rfc3339ms(m.PublishedAt),
		Attrs:       attrsMap(m.Attrs), RejectReason: d.Reason,
	}
}

func referenceFetched(t testing.TB, topic, grp string, ds []group.Delivery) []byte {
	msgs := make([]fetchedMessage, len(ds))
	for i, d := range ds {
		msgs[i] = fetchedJSON(topic, grp, d)
	}
	b, err := json.Marshal(map[string]any{"messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The hand-written fetch answer is byte for byte what encoding/json writes
// for the fetchedMessage structs: escaping (HTML characters, control
// characters, invalid UTF-8, U+2028), attribute order and repeats, empty
// lists, extreme numbers.
func TestAppendFetchedMatchesJSON(t *testing.T) {
	odd := []string{"", "plain", `q"uote`, `back\slash`, "<b>&amp;</b>", "tab\tnl\n", "\x00\x1f\x7f",
		"é ü 漢字", "bad\xffutf8", "\u2028\u2029", "emoji 😀"}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return odd[rnd.IntN(len(odd))] }
	var cases [][]group.Delivery
	cases = append(cases, nil, []group.Delivery{})
	for n := range 300 {
		var ds []group.Delivery
		for j := range 1 + n%4 {
			m := &mlog.Message{IdempotencyKey: pick(), MaxRetry: int64(rnd.IntN(2000)) - 1,
				PublishedAt: []int64{0, 1764500000123, -1, 253402300799999}[rnd.IntN(4)]}
			m.Value = make([]byte, rnd.IntN(40))
			for k := range m.Value {
				m.Value[k] = byte(rnd.IntN(256))
			}
			for range rnd.IntN(4) {
				name := []string{"a", "b", "Z", pick()}[rnd.IntN(4)]
				m.Attrs = append(m.Attrs, mlog.Attr{Name: name, Value: pick()})
			}
			ds = append(ds, group.Delivery{Partition: uint32(rnd.IntN(3)) + uint32(j)*0xffff, Offset: rnd.Uint64() >> rnd.IntN(64),
				RetryCount: uint32(rnd.IntN(10)), Delivery: rnd.Uint64() >> 1, Reason: pick(), Msg: m})
		}
		cases = append(cases, ds)
	}
	for i, ds := range cases {
		topic, grp := []string{"orders", "t.1-x_y"}[i%2], pick()
		want := referenceFetched(t, topic, grp, ds)
		got := appendFetched(nil, topic, grp, ds)
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// BenchmarkFetchAnswer encodes the answer to a fetch of 100 messages of
// 1 KiB with two attributes: json (fetchedMessage structs through
// encoding/json, as before) or append (appendFetched).
//
//	go test -run '^$' -bench FetchAnswer ./api/
func BenchmarkFetchAnswer(b *testing.B) {
	ds := make([]group.Delivery, 100)
	for i := range ds {
		ds[i] = group.Delivery{Partition: uint32(i % 4), Offset: uint64(1000 + i), Delivery: 12345,
			Msg: &mlog.Message{PublishedAt: 1764500000123, MaxRetry: 5, IdempotencyKey: fmt.Sprintf("order-%d", i),
				Attrs: []mlog.Attr{{Name: "type", Value: "created"}, {Name: "region", Value: "eu"}}, Value: bytes.Repeat([]byte("x"), 1024)}}
	}
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = referenceFetched(b, "orders", "g", ds)
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendFetched(buf[:0], "orders", "g", ds)
		}
	})
}
