package systest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// secret marks header values that an error message must never echo.
const secret = "s3cr3t-h34der-v4lue"

type BadCase struct {
	Name   string
	Method string
	Path   string
	Body   any // nil, string (raw) or a value sent as JSON
	Hdr    map[string]string
	repeat []string // headers sent twice, each value valid on its own
	want   int      // exact status; 0 means any 4xx
	// results, if set, expects 200 with per-receipt results all equal to it.
	results string
}

// Malformed requests get a 4xx with a JSON error body and leave the nodes healthy.
func CheckBadInput(t *testing.T, c *tc.Cluster) {
	leader, _ := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "bad", nil)
	tc.MustTopic(t, leader, "small", map[string]any{"max_message_bytes": 100})
	tc.MustTopic(t, leader, "shrink", map[string]any{"partitions": 3})

	// Positive controls for the name rules: 200 characters and all allowed signs.
	for _, name := range []string{strings.Repeat("a", 200), "Az09._-x", "a..b"} {
		tc.MustTopic(t, leader, name, nil)
	}

	const (
		topics = "/v1/topics/"
		fetch  = "/v1/topics/bad/groups/g/fetch"
		ack    = "/v1/topics/bad/groups/g/ack"
		nack   = "/v1/topics/bad/groups/g/nack"
		extend = "/v1/topics/bad/groups/g/extend"
		pub    = "/v1/topics/bad/messages"
	)
	long := strings.Repeat("a", 201)
	var batch1001 strings.Builder
	batch1001.WriteString(`{"messages":[`)
	for i := range 1001 {
		if i > 0 {
			batch1001.WriteString(",")
		}
		batch1001.WriteString(`{"value":"x"}`)
	}
	batch1001.WriteString("]}")

	attrs65 := map[string]string{}
	for i := range 65 {
		attrs65[fmt.Sprintf("Mq-Attr-A%d", i)] = "v"
	}

	cases := []BadCase{
		// topic config
		{Name: "topic bad JSON", Method: "PUT", Path: topics + "t1", Body: `{"partitions":`, want: 400},
		{Name: "topic body not an object", Method: "PUT", Path: topics + "t1", Body: `[]`, want: 400},
		{Name: "topic unknown field (typo max_retries)", Method: "PUT", Path: topics + "t1", Body: `{"max_retries":3}`, want: 400},
		{Name: "topic wrong type", Method: "PUT", Path: topics + "t1", Body: `{"partitions":"2"}`, want: 400},
		{Name: "topic negative partitions", Method: "PUT", Path: topics + "t1", Body: `{"partitions":-1}`, want: 400},
		{Name: "topic negative ack_timeout_ms", Method: "PUT", Path: topics + "t1", Body: `{"ack_timeout_ms":-5}`, want: 400},
		{Name: "topic negative max_messages", Method: "PUT", Path: topics + "t1", Body: `{"max_messages":-1}`, want: 400},
		{Name: "topic fractional max_retry", Method: "PUT", Path: topics + "t1", Body: `{"max_retry":1.5}`, want: 400},
		{Name: "topic unknown overflow", Method: "PUT", Path: topics + "t1", Body: `{"overflow":"bogus"}`, want: 400},
		{Name: "partitions shrink", Method: "PUT", Path: topics + "shrink", Body: `{"partitions":2}`, want: 409},
		// names
		{Name: "topic name with space", Method: "PUT", Path: topics + "bad%20name", Body: `{}`, want: 400},
		{Name: "topic name 201 chars", Method: "PUT", Path: topics + long, Body: `{}`, want: 400},
		{Name: "topic name with $", Method: "PUT", Path: topics + "bad$name", Body: `{}`, want: 400},
		{Name: "topic name ..", Method: "PUT", Path: topics + "..", Body: `{}`},
		{Name: "topic name . ", Method: "PUT", Path: topics + ".", Body: `{}`},
		{Name: "topic name %2E%2E", Method: "PUT", Path: topics + "%2E%2E", Body: `{}`},
		{Name: "group name with space", Method: "POST", Path: "/v1/topics/bad/groups/bad%20g/fetch", Body: `{}`, want: 400},
		{Name: "group name 201 chars", Method: "POST", Path: "/v1/topics/bad/groups/" + long + "/fetch", Body: `{}`, want: 400},
		{Name: "group name ..", Method: "PUT", Path: "/v1/topics/bad/groups/%2E%2E", Body: `{}`},
		// odd bytes in names
		{Name: "topic name non-ASCII", Method: "PUT", Path: topics + "caf%C3%A9", Body: `{}`, want: 400},
		{Name: "topic name NUL", Method: "PUT", Path: topics + "a%00b", Body: `{}`, want: 400},
		{Name: "topic name invalid UTF-8", Method: "PUT", Path: topics + "a%FFb", Body: `{}`, want: 400},
		{Name: "topic name encoded slash", Method: "PUT", Path: topics + "a%2Fb", Body: `{}`},
		{Name: "topic name encoded newline", Method: "PUT", Path: topics + "a%0Ab", Body: `{}`, want: 400},
		{Name: "group name invalid UTF-8", Method: "POST", Path: "/v1/topics/bad/groups/g%FE/fetch", Body: `{}`, want: 400},
		{Name: "group name NUL", Method: "PUT", Path: "/v1/topics/bad/groups/g%00", Body: `{}`, want: 400},
		// huge numbers
		{Name: "topic partitions beyond int64", Method: "PUT", Path: topics + "t1", Body: `{"partitions":99999999999999999999999}`, want: 400},
		{Name: "topic partitions 1e400", Method: "PUT", Path: topics + "t1", Body: `{"partitions":1e400}`, want: 400},
		{Name: "topic partitions 1025", Method: "PUT", Path: topics + "t1", Body: `{"partitions":1025}`, want: 400},
		{Name: "topic ack_timeout_ms 2^63", Method: "PUT", Path: topics + "t1", Body: `{"ack_timeout_ms":9223372036854775808}`, want: 400},
		{Name: "topic ack_timeout_ms over 12 h", Method: "PUT", Path: topics + "t1", Body: `{"ack_timeout_ms":43200001}`, want: 400},
		{Name: "topic max_retry huge", Method: "PUT", Path: topics + "t1", Body: `{"max_retry":18446744073709551615}`, want: 400},
		{Name: "topic max_message_bytes over 16 MiB", Method: "PUT", Path: topics + "t1", Body: `{"max_message_bytes":16777217}`, want: 400},
		{Name: "fetch max 1e20", Method: "POST", Path: fetch, Body: `{"max":1e20}`, want: 400},
		{Name: "fetch wait_ms 2^64", Method: "POST", Path: fetch, Body: `{"wait_ms":18446744073709551616}`, want: 400},
		{Name: "fetch lease_ms over 12 h", Method: "POST", Path: fetch, Body: `{"lease_ms":43200001}`, want: 400},
		{Name: "extend lease_ms 2^63", Method: "POST", Path: extend, Body: `{"receipts":["abc"],"lease_ms":9223372036854775808}`, want: 400},
		{Name: "nack delay_ms over 90 days", Method: "POST", Path: nack, Body: `{"receipts":["abc"],"delay_ms":7776000001}`, want: 400},
		{Name: "dlq limit huge", Method: "GET", Path: "/v1/topics/bad/groups/g/dlq?limit=99999999999999999999", want: 400},
		{Name: "dlq after negative", Method: "GET", Path: "/v1/topics/bad/groups/g/dlq?after=-1", want: 400},
		{Name: "replay rate huge", Method: "POST", Path: "/v1/topics/bad/groups/g/dlq/replay", Body: `{"all":true,"rate_per_sec":1e30}`, want: 400},
		{Name: "dlq delete id huge", Method: "DELETE", Path: "/v1/topics/bad/groups/g/dlq/99999999999999999999999", want: 400},
		// odd or huge header values
		{Name: "publish Mq-Delay-Ms beyond int64", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "99999999999999999999999"}, want: 400},
		{Name: "publish Mq-Delay-Ms over 90 days", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "7776000001"}, want: 400},
		{Name: "publish Mq-Delay-Ms with spaces", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "1 0"}, want: 400},
		{Name: "publish Mq-Producer-Seq 2^64", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "18446744073709551616"}, want: 400},
		{Name: "publish Mq-Max-Retry negative", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Max-Retry": "-1"}, want: 400},
		{Name: "publish Mq-Backoff-Base-Ms huge", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Backoff-Base-Ms": "1e99"}, want: 400},
		{Name: "publish Mq-Timeout-Ms 0", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Timeout-Ms": "0"}, want: 400},
		{Name: "publish Mq-Timeout-Ms huge", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Timeout-Ms": "99999999999999999999"}, want: 400},
		{Name: "publish Mq-Partition-Key 257 bytes", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Partition-Key": strings.Repeat("k", 257)}, want: 400},
		{Name: "publish Mq-Attr value invalid UTF-8", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Attr-Color": "bl\xffue"}, want: 400},
		{Name: "publish Mq-Attr value 4097 bytes", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Attr-Color": strings.Repeat("v", 4097)}, want: 400},
		{Name: "publish Mq-Attr name 129 bytes", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Attr-" + strings.Repeat("n", 129): "v"}, want: 400},
		{Name: "publish 65 Mq-Attr headers", Method: "POST", Path: pub, Body: "x", Hdr: attrs65, want: 400},
		// keys: 1..256 bytes of UTF-8, each key header at most once; the
		// error never echoes a header's value
		{Name: "publish empty Idempotency-Key", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Idempotency-Key": ""}, want: 400},
		{Name: "publish empty Mq-Partition-Key", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Partition-Key": ""}, want: 400},
		{Name: "publish empty Mq-Producer-Id", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": "", "Mq-Producer-Seq": "0"}, want: 400},
		{Name: "publish Idempotency-Key invalid UTF-8", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Idempotency-Key": "\xff" + secret + "\xfe"}, want: 400},
		{Name: "publish Mq-Partition-Key invalid UTF-8", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Partition-Key": secret + "\x80"}, want: 400},
		{Name: "publish Mq-Producer-Id invalid UTF-8", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": secret + "\xc3", "Mq-Producer-Seq": "0"}, want: 400},
		{Name: "publish Idempotency-Key 257 bytes, not echoed", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Idempotency-Key": secret + strings.Repeat("k", 257)}, want: 400},
		{Name: "publish Idempotency-Key twice", Method: "POST", Path: pub, Body: "x", repeat: []string{"Idempotency-Key"}, want: 400},
		{Name: "publish Mq-Producer-Id twice", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Seq": "0"}, repeat: []string{"Mq-Producer-Id"}, want: 400},
		{Name: "publish Mq-Producer-Seq twice", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": "p"}, repeat: []string{"Mq-Producer-Seq"}, want: 400},
		{Name: "publish Mq-Partition-Key twice", Method: "POST", Path: pub, Body: "x", repeat: []string{"Mq-Partition-Key"}, want: 400},
		{Name: "publish Mq-Delay-Ms twice", Method: "POST", Path: pub, Body: "x", repeat: []string{"Mq-Delay-Ms"}, want: 400},
		{Name: "publish Mq-Attr-X twice", Method: "POST", Path: pub, Body: "x", repeat: []string{"Mq-Attr-X"}, want: 400},
		{Name: "publish Mq-Timeout-Ms twice", Method: "POST", Path: pub, Body: "x", repeat: []string{"Mq-Timeout-Ms"}, want: 400},
		{Name: "batch producer twice", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x"}]}`, Hdr: map[string]string{"Mq-Producer-Seq": "0"}, repeat: []string{"Mq-Producer-Id"}, want: 400},
		// unknown things
		{Name: "get unknown topic", Method: "GET", Path: topics + "nope", want: 404},
		{Name: "publish unknown topic", Method: "POST", Path: topics + "nope/messages", Body: "x", want: 404},
		{Name: "fetch unknown topic", Method: "POST", Path: topics + "nope/groups/g/fetch", Body: `{}`, want: 404},
		// an unknown topic is a 404 whether or not the receipts parse
		{Name: "ack unknown topic, malformed receipt", Method: "POST", Path: topics + "nope/groups/g/ack", Body: `{"receipts":["x"]}`, want: 404},
		{Name: "nack unknown topic, malformed receipt", Method: "POST", Path: topics + "nope/groups/g/nack", Body: `{"receipts":["x"]}`, want: 404},
		{Name: "extend unknown topic, malformed receipt", Method: "POST", Path: topics + "nope/groups/g/extend", Body: `{"receipts":["x"],"lease_ms":1000}`, want: 404},
		{Name: "unknown route", Method: "GET", Path: "/v1/nope", want: 404},
		{Name: "wrong method", Method: "PATCH", Path: topics + "bad"},
		// publish
		{Name: "publish over max_message_bytes", Method: "POST", Path: topics + "small/messages", Body: strings.Repeat("x", 101), want: 413},
		{Name: "publish over default 1 MiB", Method: "POST", Path: pub, Body: strings.Repeat("x", 1<<20+1), want: 413},
		{Name: "publish bad Mq-Delay-Ms", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "soon"}, want: 400},
		{Name: "publish negative Mq-Delay-Ms", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Delay-Ms": "-5"}, want: 400},
		{Name: "publish bad Mq-Max-Retry", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Max-Retry": "many"}, want: 400},
		{Name: "publish bad Mq-Producer-Seq", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "one"}, want: 400},
		{Name: "publish Idempotency-Key 257 bytes", Method: "POST", Path: pub, Body: "x", Hdr: map[string]string{"Idempotency-Key": strings.Repeat("k", 257)}, want: 400},
		{Name: "batch bad JSON", Method: "POST", Path: pub + ":batch", Body: `{"messages":[`, want: 400},
		{Name: "batch unknown field", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x","valu":"y"}]}`, want: 400},
		{Name: "batch 1001 messages", Method: "POST", Path: pub + ":batch", Body: batch1001.String(), want: 413},
		// a single publish's message headers on a batch: refused, not
		// ignored (a retried batch would store every message twice)
		{Name: "batch with an Idempotency-Key header", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x"}]}`, Hdr: map[string]string{"Idempotency-Key": "whole-batch"}, want: 400},
		{Name: "batch with an Mq-Attr header", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x"}]}`, Hdr: map[string]string{"Mq-Attr-Color": "blue"}, want: 400},
		{Name: "batch with Mq-Delay-Ms -5", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x"}]}`, Hdr: map[string]string{"Mq-Delay-Ms": "-5"}, want: 400},
		{Name: "batch with Mq-Backoff-Base-Ms", Method: "POST", Path: pub + ":batch", Body: `{"messages":[{"value":"x"}]}`, Hdr: map[string]string{"Mq-Backoff-Base-Ms": "10"}, want: 400},
		// fetch
		{Name: "fetch bad JSON", Method: "POST", Path: fetch, Body: `{"max":`, want: 400},
		{Name: "fetch unknown field", Method: "POST", Path: fetch, Body: `{"maxx":1}`, want: 400},
		{Name: "fetch wrong type", Method: "POST", Path: fetch, Body: `{"max":"10"}`, want: 400},
		{Name: "fetch negative max", Method: "POST", Path: fetch, Body: `{"max":-1}`, want: 400},
		{Name: "fetch negative wait_ms", Method: "POST", Path: fetch, Body: `{"wait_ms":-1}`, want: 400},
		{Name: "fetch negative lease_ms", Method: "POST", Path: fetch, Body: `{"lease_ms":-1}`, want: 400},
		// ack, nack, extend
		{Name: "ack bad JSON", Method: "POST", Path: ack, Body: `{"receipts":[`, want: 400},
		{Name: "ack receipts not a list", Method: "POST", Path: ack, Body: `{"receipts":"abc"}`, want: 400},
		{Name: "ack unknown field", Method: "POST", Path: ack, Body: `{"receipt":["abc"]}`, want: 400},
		{Name: "nack wrong type", Method: "POST", Path: nack, Body: `{"receipts":["abc"],"retryable":"yes"}`, want: 400},
		{Name: "nack negative delay_ms", Method: "POST", Path: nack, Body: `{"receipts":["abc"],"delay_ms":-5}`, want: 400},
		{Name: "extend negative lease_ms", Method: "POST", Path: extend, Body: `{"receipts":["abc"],"lease_ms":-1}`, want: 400},
		{Name: "ack invalid receipts", Method: "POST", Path: ack, Body: map[string]any{"receipts": []string{"garbage", "", "Zm9vYmFy", strings.Repeat("A", 300)}}, results: "invalid"},
		{Name: "nack invalid receipts", Method: "POST", Path: nack, Body: map[string]any{"receipts": []string{"garbage", "Zm9vYmFy"}, "reason": "r", "retryable": true}, results: "invalid"},
		{Name: "extend invalid receipts", Method: "POST", Path: extend, Body: map[string]any{"receipts": []string{"garbage"}, "lease_ms": 1000}, results: "invalid"},
	}
	nodes := c.Live()
	ctx := tc.CtxFor(t, 60*time.Second)
	for i, bc := range cases {
		via := nodes[i%len(nodes)]
		h := http.Header{}
		for k, v := range bc.Hdr {
			h.Set(k, v)
		}
		for _, k := range bc.repeat {
			if v1, v2 := "r1-"+secret, "r2-"+secret; strings.HasSuffix(k, "-Ms") || strings.HasSuffix(k, "-Seq") {
				h.Add(k, "1") // valid values each: only the repeat is wrong
				h.Add(k, "2")
			} else {
				h.Add(k, v1)
				h.Add(k, v2)
			}
		}
		r, err := via.DoHeader(ctx, bc.Method, bc.Path, bc.Body, h)
		if err != nil {
			t.Errorf("%s: %s %s via %s: no answer: %v", bc.Name, bc.Method, bc.Path, via, err)
			continue
		}
		if bc.results != "" {
			checkResults(t, bc, via, r)
			continue
		}
		if (bc.want != 0 && r.Status != bc.want) || r.Status < 400 || r.Status > 499 {
			want := "a 4xx"
			if bc.want != 0 {
				want = fmt.Sprint(bc.want)
			}
			t.Errorf("%s: %s %s via %s: status %d %s, want %s", bc.Name, bc.Method, Shorten(bc.Path), via, r.Status, Shorten(string(r.Body)), want)
			continue
		}
		if _, err := r.CheckError(); err != nil {
			t.Errorf("%s: status %d: %v", bc.Name, r.Status, err)
		}
		if strings.Contains(string(r.Body), secret) {
			t.Errorf("%s: the error echoes a header's value: %s", bc.Name, Shorten(string(r.Body)))
		}
	}
	// Every node is still healthy and serving.
	for _, n := range nodes {
		r, err := n.Do(ctx, http.MethodGet, "/healthz", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Errorf("node %s /healthz after bad input: %v %v", n, r, err)
		}
		tc.MustPublish(t, n, "bad", "still fine via "+n.ID(), nil)
	}
}

func checkResults(t *testing.T, bc BadCase, via *tc.Node, r *tc.Response) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Errorf("%s via %s: status %d %s, want 200 with per-receipt %q", bc.Name, via, r.Status, Shorten(string(r.Body)), bc.results)
		return
	}
	var rr tc.ReceiptResults
	if err := r.JSON(&rr); err != nil {
		t.Errorf("%s: %v", bc.Name, err)
		return
	}
	want := len(bc.Body.(map[string]any)["receipts"].([]string))
	if len(rr.Results) != want {
		t.Errorf("%s: %d results for %d receipts: %s", bc.Name, len(rr.Results), want, r.Body)
		return
	}
	for i, res := range rr.Results {
		if res.Status != bc.results {
			t.Errorf("%s: receipt %d status %q, want %q", bc.Name, i, res.Status, bc.results)
		}
	}
}

func Shorten(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// rawExchange sends raw bytes on a fresh connection to n and reads what comes
// back until the server closes or d passes. The send function writes the
// request (it may stall or half-close the connection).
func rawExchange(t *testing.T, n *tc.Node, d time.Duration, send func(c *net.TCPConn)) (answer string, closed bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", n.HTTPAddr(), 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", n, err)
	}
	defer conn.Close()
	c := conn.(*net.TCPConn)
	c.SetDeadline(time.Now().Add(d))
	send(c)
	b, err := io.ReadAll(c)
	var ne net.Error
	timedOut := errors.As(err, &ne) && ne.Timeout()
	return string(b), !timedOut
}

// checkRawAnswer accepts a 4xx answer with a JSON error body, or (if
// allowClose) a connection closed by the server without an answer.
func checkRawAnswer(t *testing.T, name, answer string, closed, allowClose bool) {
	t.Helper()
	first, _, _ := strings.Cut(answer, "\r\n")
	t.Logf("%s: answer %q, closed %v", name, first, closed)
	if answer == "" {
		if !closed {
			t.Errorf("%s: no answer and the connection still open after the bound", name)
		} else if !allowClose {
			t.Errorf("%s: connection closed without an answer, want a 4xx", name)
		}
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(answer)), nil)
	if err != nil {
		t.Errorf("%s: unparsable answer %q: %v", name, Shorten(answer), err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 400 || resp.StatusCode > 499 {
		t.Errorf("%s: status %d %s, want a 4xx", name, resp.StatusCode, Shorten(string(body)))
		return
	}
	r := &tc.Response{Status: resp.StatusCode, Body: body}
	if _, err := r.CheckError(); err != nil {
		t.Errorf("%s: status %d: %v", name, resp.StatusCode, err)
	}
	if resp.Header.Get("Mq-Request-Id") == "" {
		t.Errorf("%s: the answer carries no Mq-Request-Id: %q", name, Shorten(answer))
	}
}

// Requests cut short, stalled or malformed at the byte level: each is
// answered with a 4xx JSON error or has its connection closed, stores
// nothing, does not hold up other clients, and leaves the node healthy.
func CheckBadInputRaw(t *testing.T, c *tc.Cluster) {
	leader, _ := tc.MustRoles(t, c)
	const topic = "bad-raw"
	tc.MustTopic(t, leader, topic, nil)
	nodes := c.Live()
	n := nodes[len(nodes)-1]
	head := func(length int, extra string) string {
		return fmt.Sprintf("POST /v1/topics/%s/messages HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n", topic, n.HTTPAddr(), length, extra)
	}

	// Truncated body: 10 of 100 bytes, then the client half-closes.
	ans, closed := rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
		c.Write([]byte(head(100, "") + "0123456789"))
		c.CloseWrite()
	})
	checkRawAnswer(t, "truncated body", ans, closed, true)

	// Truncated chunked body.
	ans, closed = rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
		c.Write([]byte(fmt.Sprintf("POST /v1/topics/%s/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nabc", topic)))
		c.CloseWrite()
	})
	checkRawAnswer(t, "truncated chunked body", ans, closed, true)

	// A declared body over the 17 MiB limit is refused without reading it,
	// 413 (not the body budget's 503, which a retry cannot help: 200 MiB
	// is over the whole 128 MiB budget; 20 GB would overflow a read
	// deadline computed from it).
	for _, size := range []int{20 << 20, 200 << 20, 20 << 30} {
		ans, closed = rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
			c.Write([]byte(head(size, "")))
		})
		what := fmt.Sprintf("declared %d MiB body", size>>20)
		checkRawAnswer(t, what, ans, closed, true)
		if !strings.HasPrefix(ans, "HTTP/1.1 413 ") || !strings.Contains(ans, "request_too_large") {
			t.Errorf("%s: answer %q, want 413 request_too_large", what, Shorten(ans))
		}
	}

	// Not HTTP at all, and a header with a control byte.
	ans, closed = rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
		c.Write([]byte("GARBAGE\x00\xff\r\n\r\n"))
	})
	checkRawAnswer(t, "garbage request line", ans, closed, true)
	ans, closed = rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
		c.Write([]byte(head(1, "Idempotency-Key: a\x01b\r\n") + "x"))
		c.CloseWrite()
	})
	checkRawAnswer(t, "control byte in a header value", ans, closed, true)

	// fasthttp's parse errors quote the header buffer: the answer must not
	// (nor the log, checked below), and each gets a fixed JSON error.
	leaks := []struct {
		name, extra string
		want        int
	}{
		{"header line without a colon", "Authorization: Bearer " + secret + "\r\nNo colon here\r\n", 400},
		{"control byte next to a credential", "Authorization: Bearer " + secret + "\r\nX-Bad: a\x01b\r\n", 400},
		{"request head over the read buffer", "Authorization: Bearer " + secret + "\r\nX-Big: " + strings.Repeat("b", 70<<10) + "\r\n", 431},
	}
	for _, l := range leaks {
		ans, closed = rawExchange(t, n, 10*time.Second, func(c *net.TCPConn) {
			c.Write([]byte(head(1, l.extra) + "x"))
			c.CloseWrite()
		})
		checkRawAnswer(t, l.name, ans, closed, false)
		if strings.Contains(ans, secret) {
			t.Errorf("%s: the answer echoes the request's headers: %q", l.name, Shorten(ans))
		}
		if !strings.HasPrefix(ans, fmt.Sprintf("HTTP/1.1 %d ", l.want)) {
			t.Errorf("%s: answer %q, want status %d", l.name, Shorten(ans), l.want)
		}
		for _, internal := range []string{"fasthttp", "buffer size", "contents", "ReadBufferSize"} {
			if strings.Contains(strings.ToLower(ans), strings.ToLower(internal)) {
				t.Errorf("%s: fasthttp's internal error text reaches the client: %q", l.name, Shorten(ans))
			}
		}
	}

	// Names come from the path as sent: an encoded slash or a dot segment
	// is a bad name or no route, never a step to another topic (deleting
	// x%2F..%2Fvictim used to delete victim).
	const victim = "bad-raw-victim"
	tc.MustTopic(t, leader, victim, nil)
	for _, p := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"DELETE", "/v1/topics/x%2F..%2F" + victim, 400, "invalid_name"},
		{"DELETE", "/v1/topics/x/../" + victim, 404, "not_found"},
		{"DELETE", "/v1/topics/x/%2E%2E/" + victim, 404, "not_found"},
		{"PUT", "/v1/topics/..", 400, "invalid_name"},
		{"PUT", "/v1/topics/.", 400, "invalid_name"},
		{"PUT", "/v1/topics/a%2Fb", 400, "invalid_name"},
		{"GET", "/v1/topics/%zz", 400, "bad_request"},
		// a follower forwards the path as sent: the leader must not see
		// DELETE /v1/topics/bad-raw-victim
		{"DELETE", "/v1/topics/" + victim + "/groups/g/dlq/..%2F..%2F..%2F..%2F" + victim, 400, "bad_request"},
	} {
		for _, via := range c.Live() {
			what := p.method + " " + p.path + " via " + via.ID()
			ans, _ := rawExchange(t, via, 10*time.Second, func(c *net.TCPConn) {
				fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", p.method, p.path)
			})
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(ans)), nil)
			if err != nil {
				t.Errorf("%s: unparsable answer %q: %v", what, Shorten(ans), err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			code, err := (&tc.Response{Status: resp.StatusCode, Body: body}).CheckError()
			if resp.StatusCode != p.status || code != p.code || err != nil {
				t.Errorf("%s: %d %s (%v), want %d %s", what, resp.StatusCode, Shorten(string(body)), err, p.status, p.code)
			}
		}
	}
	if r, err := n.Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/topics/"+victim, nil, nil); err != nil || r.Status != http.StatusOK {
		t.Errorf("topic %s after the dot-segment requests: %v %v, want it still there", victim, r, err)
	}

	// A slow body: 10 bytes, a 3 s stall, then the rest. Meanwhile other
	// clients are served at once; the slow publish completes normally.
	slowDone := make(chan string, 1)
	go func() {
		conn, err := net.DialTimeout("tcp", n.HTTPAddr(), 2*time.Second)
		if err != nil {
			slowDone <- "dial: " + err.Error()
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		conn.Write([]byte(head(20, "Idempotency-Key: slow-body\r\n") + "slow-body-"))
		time.Sleep(3 * time.Second)
		conn.Write([]byte("0123456789"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			slowDone <- "read: " + err.Error()
			return
		}
		resp.Body.Close()
		slowDone <- fmt.Sprint(resp.StatusCode)
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	tc.MustPublish(t, n, topic, "while a body is stalled", nil)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("publish while another body is stalled took %v", d)
	}
	if got := <-slowDone; got != "201" {
		t.Errorf("slow body: %s, want 201", got)
	}

	// Any UTF-8 is fine in an idempotency key (compared byte for byte);
	// bytes that are not UTF-8 are refused (above), since fetch answers
	// JSON, where two such keys would read the same.
	odd := map[string]string{"Idempotency-Key": "\u00e9t\u00e9 \u2603 \U0001F600 key"}
	first := tc.MustPublish(t, n, topic, "odd key", odd)
	again := tc.MustPublish(t, n, topic, "odd key", odd)
	if !again.Duplicate || again.Offset != first.Offset || again.Partition != first.Partition {
		t.Errorf("odd idempotency key: first %+v, repeat %+v, want the repeat to be a duplicate of the first", first, again)
	}

	// Nothing from the cut requests was stored: exactly the three publishes.
	ctx := tc.CtxFor(t, 15*time.Second)
	// The answers written before routing are counted: under the route's
	// pattern when the body was refused from the head, else as unparsed
	// (two bodies cut short, four bad heads, one head too large).
	fams := Scrape(ctx, t, n)
	for _, w := range []struct {
		route, code string
		min         float64
	}{{"/v1/topics/{topic}/messages", "413", 3}, {"unparsed", "400", 6}, {"unparsed", "431", 1}} {
		if v, _ := MetricValue(fams, "mqd_http_requests_total", map[string]string{"route": w.route, "code": w.code}); v < w.min {
			t.Errorf("mqd_http_requests_total{route=%q,code=%q} = %v, want at least %v", w.route, w.code, v, w.min)
		}
	}
	if s, err := n.Stats(ctx, topic); err != nil {
		t.Errorf("stats: %v", err)
	} else if s.NextOffsets() != 3 {
		t.Errorf("%s holds %d messages, want 3 (slow, concurrent, odd key): a cut request was stored", topic, s.NextOffsets())
	}
	for _, nd := range nodes {
		r, err := nd.Do(ctx, http.MethodGet, "/healthz", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Errorf("node %s /healthz after raw bad input: %v %v", nd, r, err)
		}
		if b, err := os.ReadFile(nd.LogPath()); err != nil {
			t.Errorf("node %s log: %v", nd, err)
		} else if i := bytes.Index(b, []byte(secret)); i >= 0 {
			t.Errorf("node %s logged a request header's value: %q", nd, b[max(0, i-200):min(len(b), i+50)])
		}
		tc.MustPublish(t, nd, topic, "still fine after raw input via "+nd.ID(), nil)
	}
}
