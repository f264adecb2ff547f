package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	mlog "github.com/mqd/mqd/log"
)

func TestDecodeStrictAccepts(t *testing.T) {
	var f fetchBody
	if err := decodeStrict([]byte(" {\"max\": 5, \"wait_ms\": 0, \"lease_ms\": 1500}\n\t"), &f); err != nil {
		t.Fatalf("fetch body: %v", err)
	}
	if f.Max == nil || *f.Max != 5 || f.WaitMs == nil || *f.WaitMs != 0 || f.LeaseMs == nil || *f.LeaseMs != 1500 {
		t.Fatalf("fetch body decoded as %+v", f)
	}
	var b batchBody
	body := `{"messages":[{"value":"héllo","idempotency_key":"k","partition_key":"p","delay_ms":5,"max_retry":2,"attrs":{"a":"1"}},{"value_b64":"AAE="}]}`
	if err := decodeStrict([]byte(body), &b); err != nil {
		t.Fatalf("batch body: %v", err)
	}
	if len(b.Messages) != 2 || *b.Messages[0].Value != "héllo" || *b.Messages[0].IdempotencyKey != "k" ||
		*b.Messages[0].PartitionKey != "p" || *b.Messages[0].DelayMs != 5 || *b.Messages[0].MaxRetry != 2 ||
		!reflect.DeepEqual(b.Messages[0].Attrs, map[string]string{"a": "1"}) || *b.Messages[1].ValueB64 != "AAE=" ||
		b.Messages[1].Value != nil {
		t.Fatalf("batch body decoded as %+v", b)
	}
	var r receiptsBody
	if err := decodeStrict([]byte(`{"receipts":["a","b"],"lease_ms":10}`), &r); err != nil {
		t.Fatalf("receipts body: %v", err)
	}
	if !reflect.DeepEqual(r.Receipts, []string{"a", "b"}) || *r.LeaseMs != 10 {
		t.Fatalf("receipts body decoded as %+v", r)
	}
	var tb topicBody
	if err := decodeStrict([]byte(`{"partitions":3,"overflow":"drop-head","retention_ms":0}`), &tb); err != nil {
		t.Fatalf("topic body: %v", err)
	}
	if *tb.Partitions != 3 || *tb.Overflow != "drop-head" || *tb.RetentionMs != 0 || tb.MaxRetry != nil {
		t.Fatalf("topic body decoded as %+v", tb)
	}
}

func TestDecodeStrictRefuses(t *testing.T) {
	cases := []struct {
		name, body string
		into       func() any
		mention    string // the error message names the culprit
	}{
		{"empty", "", func() any { return &fetchBody{} }, "empty"},
		{"blank", " \n\t ", func() any { return &fetchBody{} }, "empty"},
		{"unknown field", `{"max":1,"maxx":2}`, func() any { return &fetchBody{} }, "maxx"},
		{"field in another case", `{"MAX":1}`, func() any { return &fetchBody{} }, "MAX"},
		{"repeated field", `{"max":1,"max":2}`, func() any { return &fetchBody{} }, "max"},
		{"invalid UTF-8 in a string", "{\"messages\":[{\"value\":\"a\xffb\"}]}", func() any { return &batchBody{} }, "UTF-8"},
		{"typo in topic config", `{"max_retries":3}`, func() any { return &topicBody{} }, "max_retries"},
		{"unknown nested field", `{"messages":[{"value":"a","key":"k"}]}`, func() any { return &batchBody{} }, "key"},
		{"string for number", `{"max":"5"}`, func() any { return &fetchBody{} }, "max"},
		{"float for integer", `{"max":1.5}`, func() any { return &fetchBody{} }, "max"},
		{"number out of int64", `{"max":99999999999999999999}`, func() any { return &fetchBody{} }, "max"},
		{"number for string", `{"overflow":1}`, func() any { return &topicBody{} }, "overflow"},
		{"object for list", `{"receipts":{"a":1}}`, func() any { return &receiptsBody{} }, "receipts"},
		{"number in string list", `{"receipts":["a",1]}`, func() any { return &receiptsBody{} }, "receipts"},
		{"non-string attr", `{"messages":[{"value":"a","attrs":{"x":1}}]}`, func() any { return &batchBody{} }, "attrs"},
		{"array body", `[]`, func() any { return &fetchBody{} }, ""},
		{"string body", `"x"`, func() any { return &fetchBody{} }, ""},
		{"trailing object", `{"max":1}{"max":2}`, func() any { return &fetchBody{} }, "trailing"},
		{"trailing garbage", `{"max":1} x`, func() any { return &fetchBody{} }, "trailing"},
		{"truncated", `{"max":1`, func() any { return &fetchBody{} }, ""},
		{"not json", `max=1`, func() any { return &fetchBody{} }, ""},
	}
	for _, c := range cases {
		err := decodeStrict([]byte(c.body), c.into())
		if !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: %q: err = %v, want ErrBadRequest", c.name, c.body, err)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: error %q does not mention %q", c.name, err, c.mention)
		}
		if st := classify(err); st.status != 400 || st.code != "bad_request" {
			t.Errorf("%s: classified as %+v, want 400 bad_request", c.name, st)
		}
	}
}

func TestDecodeStrictFieldNamesAreExact(t *testing.T) {
	for _, body := range []string{`{"MAX":5}`, `{"Wait_Ms":5}`} {
		var f fetchBody
		if err := decodeStrict([]byte(body), &f); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: err = %v, decoded %+v; want ErrBadRequest", body, err, f)
		}
	}
	var tb topicBody
	if err := decodeStrict([]byte(`{"Max_Retry":3}`), &tb); !errors.Is(err, ErrBadRequest) {
		t.Errorf(`{"Max_Retry":3}: err = %v; want ErrBadRequest`, err)
	}
}

func TestOptBody(t *testing.T) {
	var f fetchBody
	if err := optBody(nil, &f); err != nil || f.Max != nil {
		t.Fatalf("optBody(nil) = %v, %+v", err, f)
	}
	if err := optBody([]byte("  "), &f); err != nil {
		t.Fatalf("optBody(blank) = %v", err)
	}
	if err := optBody([]byte(`{"bogus":1}`), &f); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("optBody(unknown field) = %v", err)
	}
}

func TestCheckRange(t *testing.T) {
	for _, c := range []struct {
		v, lo, hi int64
		ok        bool
	}{{0, 0, 10, true}, {10, 0, 10, true}, {-1, 0, 10, false}, {11, 0, 10, false}, {1, 1, 1, true}} {
		err := checkRange("f", c.v, c.lo, c.hi)
		if (err == nil) != c.ok {
			t.Errorf("checkRange(%d, %d, %d) = %v", c.v, c.lo, c.hi, err)
		}
		if err != nil && (!errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "f must be")) {
			t.Errorf("checkRange error %v", err)
		}
	}
}

func TestTopicBodyPatch(t *testing.T) {
	decode := func(s string) (mlog.Patch, error) {
		var b topicBody
		if err := decodeStrict([]byte(s), &b); err != nil {
			return mlog.Patch{}, err
		}
		return b.patch()
	}
	p, err := decode(`{"partitions":4,"max_retry":0,"overflow":"drop-head"}`)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Apply(mlog.DefaultConfig())
	want := mlog.DefaultConfig()
	want.Partitions, want.MaxRetry, want.Overflow = 4, 0, mlog.OverflowDropHead
	if got != want {
		t.Fatalf("patch applied = %+v, want %+v", got, want)
	}
	for body, want := range map[string]error{
		`{"partitions":0}`:           mlog.ErrInvalidConfig,
		`{"partitions":-1}`:          mlog.ErrInvalidConfig,
		`{"partitions":4294967297}`:  mlog.ErrInvalidConfig, // would wrap to 1 as uint32
		`{"partitions":1025}`:        mlog.ErrInvalidConfig,
		`{"max_retry":-1}`:           mlog.ErrInvalidConfig,
		`{"ack_timeout_ms":-5}`:      mlog.ErrInvalidConfig,
		`{"retention_ms":-1}`:        mlog.ErrInvalidConfig,
		`{"max_messages":-1}`:        mlog.ErrInvalidConfig,
		`{"overflow":"drop-tail"}`:   mlog.ErrInvalidConfig,
		`{"max_message_bytes":0}`:    mlog.ErrInvalidConfig,
		`{"backoff_jitter_ms":-100}`: mlog.ErrInvalidConfig,
	} {
		_, err := decode(body)
		if !errors.Is(err, want) {
			t.Errorf("%s: err = %v, want %v", body, err, want)
		}
		if st := classify(err); st.status != 400 {
			t.Errorf("%s: status %d, want 400", body, st.status)
		}
	}
}

func TestBatchMsgToMsg(t *testing.T) {
	dec := func(s string) batchMsg {
		var b batchBody
		if err := decodeStrict([]byte(`{"messages":[`+s+`]}`), &b); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return b.Messages[0]
	}
	bm := dec(`{"value_b64":"aGk=","idempotency_key":"k","partition_key":"pk","max_retry":3,"attrs":{"b":"2","a":"1"}}`)
	m, err := bm.toMsg(0)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.msg.Value) != "hi" || m.msg.IdempotencyKey != "k" || m.partitionKey != "pk" || m.msg.MaxRetry != 3 ||
		m.msg.BackoffBaseMs != -1 || m.msg.DeliverAt != 0 ||
		!reflect.DeepEqual(m.msg.Attrs, []mlog.Attr{{Name: "a", Value: "1"}, {Name: "b", Value: "2"}}) {
		t.Fatalf("toMsg = %+v / %+v", m, m.msg)
	}
	empty := dec(`{"value":""}`)
	if m, err := empty.toMsg(0); err != nil || len(m.msg.Value) != 0 {
		t.Fatalf("empty text value: %v", err)
	}
	for _, s := range []string{
		`{}`,
		`{"value":"a","value_b64":"YQ=="}`,
		`{"value_b64":"not base64!"}`,
		`{"value":"a","delay_ms":-1}`,
		`{"value":"a","max_retry":-1}`,
		`{"value":"a","max_retry":1001}`,
		`{"value":"a","idempotency_key":""}`,
		`{"value":"a","partition_key":"` + strings.Repeat("k", 257) + `"}`,
		`{"value":"a","attrs":{"":"x"}}`,
	} {
		bm := dec(s)
		_, err := bm.toMsg(7)
		if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "messages[7]") {
			t.Errorf("%s: err = %v, want ErrBadRequest naming messages[7]", s, err)
		}
	}
}

// fuzzBodies decodes b into every request body type: it must never panic,
// refuse only with ErrBadRequest, and accept only valid JSON whose decoded
// value survives a round trip through encoding/json.
func fuzzBodies(t *testing.T, b []byte) {
	for _, mk := range []func() any{
		func() any { return &fetchBody{} },
		func() any { return &batchBody{} },
		func() any { return &receiptsBody{} },
		func() any { return &topicBody{} },
	} {
		v := mk()
		err := decodeStrict(b, v)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("%T: error %v does not wrap ErrBadRequest", v, err)
			}
			continue
		}
		if !json.Valid(b) {
			t.Fatalf("%T: accepted invalid JSON %q", v, b)
		}
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%T: marshal %+v: %v", v, v, err)
		}
		again := mk()
		if err := decodeStrict(out, again); err != nil {
			t.Fatalf("%T: re-decoding %s: %v", v, out, err)
		}
		if !reflect.DeepEqual(v, again) {
			t.Fatalf("%T: round trip changed the value:\n%s", v, out)
		}
	}
}

func addBodySeeds(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"max":10,"wait_ms":100,"lease_ms":30000}`, `{"max":-1}`, `{"max":"1"}`,
		`{"messages":[{"value":"a"},{"value_b64":"YQ==","attrs":{"k":"v"},"delay_ms":5}]}`,
		`{"messages":[{"value":"a","idempotency_key":"k","partition_key":"p","max_retry":1}]}`,
		`{"receipts":["AQAAAAAAAAAAAAAAAAAAAAAAAAAA"],"lease_ms":1}`,
		`{"partitions":2,"overflow":"drop-head","max_bytes":0}`, `{"max":1}{}`, `{"max":1} `, "{\"value\":\"\xff\"}",
		`{"messages":[{"value":"\u0000\ud800"}]}`, `{"max":1e2}`, `{"MAX":1}`,
	} {
		f.Add([]byte(s))
	}
}

func FuzzDecodeFetch(f *testing.F) {
	addBodySeeds(f)
	f.Fuzz(fuzzBodies)
}

func FuzzDecodeBatch(f *testing.F) {
	addBodySeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzBodies(t, b)
		// Whatever decodes must convert to messages or be refused cleanly.
		var bb batchBody
		if decodeStrict(b, &bb) != nil {
			return
		}
		for i := range bb.Messages {
			if _, err := bb.Messages[i].toMsg(i); err != nil && !errors.Is(err, ErrBadRequest) {
				t.Fatalf("toMsg error %v does not wrap ErrBadRequest", err)
			}
		}
	})
}

// BenchmarkDecodeBatch100 decodes a messages:batch body of 100 messages of
// 1 KiB with keys, the way publishBatch does.
func BenchmarkDecodeBatch100(b *testing.B) {
	v := strings.Repeat("x", 1024)
	var sb strings.Builder
	sb.WriteString(`{"messages":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"value":%q,"idempotency_key":"key-%d"}`, v, i)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var bb batchBody
		if err := decodeStrict(body, &bb); err != nil {
			b.Fatal(err)
		}
		if len(bb.Messages) != 100 {
			b.Fatalf("decoded %d messages", len(bb.Messages))
		}
	}
}
