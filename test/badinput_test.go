package test

import (
	"bufio"
	"bytes"
	"context"
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

type badCase struct {
	name   string
	method string
	path   string
	body   any // nil, string (raw) or a value sent as JSON
	hdr    map[string]string
	repeat []string // headers sent twice, each value valid on its own
	want   int      // exact status; 0 means any 4xx
	// results, if set, expects 200 with per-receipt results all equal to it.
	results string
}

// Malformed requests get a 4xx with a JSON error body and leave the nodes healthy.
func testBadInput(t *testing.T, c *tc.Cluster) {
	leader, _ := mustRoles(t, c)
	mustTopic(t, leader, "bad", nil)
	mustTopic(t, leader, "small", map[string]any{"max_message_bytes": 100})
	mustTopic(t, leader, "shrink", map[string]any{"partitions": 3})

	// Positive controls for the name rules: 200 characters and all allowed signs.
	for _, name := range []string{strings.Repeat("a", 200), "Az09._-x", "a..b"} {
		mustTopic(t, leader, name, nil)
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

	cases := []badCase{
		// topic config
		{name: "topic bad JSON", method: "PUT", path: topics + "t1", body: `{"partitions":`, want: 400},
		{name: "topic body not an object", method: "PUT", path: topics + "t1", body: `[]`, want: 400},
		{name: "topic unknown field (typo max_retries)", method: "PUT", path: topics + "t1", body: `{"max_retries":3}`, want: 400},
		{name: "topic wrong type", method: "PUT", path: topics + "t1", body: `{"partitions":"2"}`, want: 400},
		{name: "topic negative partitions", method: "PUT", path: topics + "t1", body: `{"partitions":-1}`, want: 400},
		{name: "topic negative ack_timeout_ms", method: "PUT", path: topics + "t1", body: `{"ack_timeout_ms":-5}`, want: 400},
		{name: "topic negative max_messages", method: "PUT", path: topics + "t1", body: `{"max_messages":-1}`, want: 400},
		{name: "topic fractional max_retry", method: "PUT", path: topics + "t1", body: `{"max_retry":1.5}`, want: 400},
		{name: "topic unknown overflow", method: "PUT", path: topics + "t1", body: `{"overflow":"bogus"}`, want: 400},
		{name: "partitions shrink", method: "PUT", path: topics + "shrink", body: `{"partitions":2}`, want: 409},
		// names
		{name: "topic name with space", method: "PUT", path: topics + "bad%20name", body: `{}`, want: 400},
		{name: "topic name 201 chars", method: "PUT", path: topics + long, body: `{}`, want: 400},
		{name: "topic name with $", method: "PUT", path: topics + "bad$name", body: `{}`, want: 400},
		{name: "topic name ..", method: "PUT", path: topics + "..", body: `{}`},
		{name: "topic name . ", method: "PUT", path: topics + ".", body: `{}`},
		{name: "topic name %2E%2E", method: "PUT", path: topics + "%2E%2E", body: `{}`},
		{name: "group name with space", method: "POST", path: "/v1/topics/bad/groups/bad%20g/fetch", body: `{}`, want: 400},
		{name: "group name 201 chars", method: "POST", path: "/v1/topics/bad/groups/" + long + "/fetch", body: `{}`, want: 400},
		{name: "group name ..", method: "PUT", path: "/v1/topics/bad/groups/%2E%2E", body: `{}`},
		// odd bytes in names
		{name: "topic name non-ASCII", method: "PUT", path: topics + "caf%C3%A9", body: `{}`, want: 400},
		{name: "topic name NUL", method: "PUT", path: topics + "a%00b", body: `{}`, want: 400},
		{name: "topic name invalid UTF-8", method: "PUT", path: topics + "a%FFb", body: `{}`, want: 400},
		{name: "topic name encoded slash", method: "PUT", path: topics + "a%2Fb", body: `{}`},
		{name: "topic name encoded newline", method: "PUT", path: topics + "a%0Ab", body: `{}`, want: 400},
		{name: "group name invalid UTF-8", method: "POST", path: "/v1/topics/bad/groups/g%FE/fetch", body: `{}`, want: 400},
		{name: "group name NUL", method: "PUT", path: "/v1/topics/bad/groups/g%00", body: `{}`, want: 400},
		// huge numbers
		{name: "topic partitions beyond int64", method: "PUT", path: topics + "t1", body: `{"partitions":99999999999999999999999}`, want: 400},
		{name: "topic partitions 1e400", method: "PUT", path: topics + "t1", body: `{"partitions":1e400}`, want: 400},
		{name: "topic partitions 1025", method: "PUT", path: topics + "t1", body: `{"partitions":1025}`, want: 400},
		{name: "topic ack_timeout_ms 2^63", method: "PUT", path: topics + "t1", body: `{"ack_timeout_ms":9223372036854775808}`, want: 400},
		{name: "topic ack_timeout_ms over 12 h", method: "PUT", path: topics + "t1", body: `{"ack_timeout_ms":43200001}`, want: 400},
		{name: "topic max_retry huge", method: "PUT", path: topics + "t1", body: `{"max_retry":18446744073709551615}`, want: 400},
		{name: "topic max_message_bytes over 16 MiB", method: "PUT", path: topics + "t1", body: `{"max_message_bytes":16777217}`, want: 400},
		{name: "fetch max 1e20", method: "POST", path: fetch, body: `{"max":1e20}`, want: 400},
		{name: "fetch wait_ms 2^64", method: "POST", path: fetch, body: `{"wait_ms":18446744073709551616}`, want: 400},
		{name: "fetch lease_ms over 12 h", method: "POST", path: fetch, body: `{"lease_ms":43200001}`, want: 400},
		{name: "extend lease_ms 2^63", method: "POST", path: extend, body: `{"receipts":["abc"],"lease_ms":9223372036854775808}`, want: 400},
		{name: "nack delay_ms over 90 days", method: "POST", path: nack, body: `{"receipts":["abc"],"delay_ms":7776000001}`, want: 400},
		{name: "dlq limit huge", method: "GET", path: "/v1/topics/bad/groups/g/dlq?limit=99999999999999999999", want: 400},
		{name: "dlq after negative", method: "GET", path: "/v1/topics/bad/groups/g/dlq?after=-1", want: 400},
		{name: "replay rate huge", method: "POST", path: "/v1/topics/bad/groups/g/dlq/replay", body: `{"all":true,"rate_per_sec":1e30}`, want: 400},
		{name: "dlq delete id huge", method: "DELETE", path: "/v1/topics/bad/groups/g/dlq/99999999999999999999999", want: 400},
		// odd or huge header values
		{name: "publish Mq-Delay-Ms beyond int64", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "99999999999999999999999"}, want: 400},
		{name: "publish Mq-Delay-Ms over 90 days", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "7776000001"}, want: 400},
		{name: "publish Mq-Delay-Ms with spaces", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "1 0"}, want: 400},
		{name: "publish Mq-Producer-Seq 2^64", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "18446744073709551616"}, want: 400},
		{name: "publish Mq-Max-Retry negative", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Max-Retry": "-1"}, want: 400},
		{name: "publish Mq-Backoff-Base-Ms huge", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Backoff-Base-Ms": "1e99"}, want: 400},
		{name: "publish Mq-Timeout-Ms 0", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Timeout-Ms": "0"}, want: 400},
		{name: "publish Mq-Timeout-Ms huge", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Timeout-Ms": "99999999999999999999"}, want: 400},
		{name: "publish Mq-Partition-Key 257 bytes", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Partition-Key": strings.Repeat("k", 257)}, want: 400},
		{name: "publish Mq-Attr value invalid UTF-8", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Attr-Color": "bl\xffue"}, want: 400},
		{name: "publish Mq-Attr value 4097 bytes", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Attr-Color": strings.Repeat("v", 4097)}, want: 400},
		{name: "publish Mq-Attr name 129 bytes", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Attr-" + strings.Repeat("n", 129): "v"}, want: 400},
		{name: "publish 65 Mq-Attr headers", method: "POST", path: pub, body: "x", hdr: attrs65, want: 400},
		// keys: 1..256 bytes of UTF-8, each key header at most once; the
		// error never echoes a header's value
		{name: "publish empty Idempotency-Key", method: "POST", path: pub, body: "x", hdr: map[string]string{"Idempotency-Key": ""}, want: 400},
		{name: "publish empty Mq-Partition-Key", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Partition-Key": ""}, want: 400},
		{name: "publish empty Mq-Producer-Id", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": "", "Mq-Producer-Seq": "0"}, want: 400},
		{name: "publish Idempotency-Key invalid UTF-8", method: "POST", path: pub, body: "x", hdr: map[string]string{"Idempotency-Key": "\xff" + secret + "\xfe"}, want: 400},
		{name: "publish Mq-Partition-Key invalid UTF-8", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Partition-Key": secret + "\x80"}, want: 400},
		{name: "publish Mq-Producer-Id invalid UTF-8", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": secret + "\xc3", "Mq-Producer-Seq": "0"}, want: 400},
		{name: "publish Idempotency-Key 257 bytes, not echoed", method: "POST", path: pub, body: "x", hdr: map[string]string{"Idempotency-Key": secret + strings.Repeat("k", 257)}, want: 400},
		{name: "publish Idempotency-Key twice", method: "POST", path: pub, body: "x", repeat: []string{"Idempotency-Key"}, want: 400},
		{name: "publish Mq-Producer-Id twice", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Seq": "0"}, repeat: []string{"Mq-Producer-Id"}, want: 400},
		{name: "publish Mq-Producer-Seq twice", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": "p"}, repeat: []string{"Mq-Producer-Seq"}, want: 400},
		{name: "publish Mq-Partition-Key twice", method: "POST", path: pub, body: "x", repeat: []string{"Mq-Partition-Key"}, want: 400},
		{name: "publish Mq-Delay-Ms twice", method: "POST", path: pub, body: "x", repeat: []string{"Mq-Delay-Ms"}, want: 400},
		{name: "publish Mq-Attr-X twice", method: "POST", path: pub, body: "x", repeat: []string{"Mq-Attr-X"}, want: 400},
		{name: "publish Mq-Timeout-Ms twice", method: "POST", path: pub, body: "x", repeat: []string{"Mq-Timeout-Ms"}, want: 400},
		{name: "batch producer twice", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x"}]}`, hdr: map[string]string{"Mq-Producer-Seq": "0"}, repeat: []string{"Mq-Producer-Id"}, want: 400},
		// unknown things
		{name: "get unknown topic", method: "GET", path: topics + "nope", want: 404},
		{name: "publish unknown topic", method: "POST", path: topics + "nope/messages", body: "x", want: 404},
		{name: "fetch unknown topic", method: "POST", path: topics + "nope/groups/g/fetch", body: `{}`, want: 404},
		// an unknown topic is a 404 whether or not the receipts parse
		{name: "ack unknown topic, malformed receipt", method: "POST", path: topics + "nope/groups/g/ack", body: `{"receipts":["x"]}`, want: 404},
		{name: "nack unknown topic, malformed receipt", method: "POST", path: topics + "nope/groups/g/nack", body: `{"receipts":["x"]}`, want: 404},
		{name: "extend unknown topic, malformed receipt", method: "POST", path: topics + "nope/groups/g/extend", body: `{"receipts":["x"],"lease_ms":1000}`, want: 404},
		{name: "unknown route", method: "GET", path: "/v1/nope", want: 404},
		{name: "wrong method", method: "PATCH", path: topics + "bad"},
		// publish
		{name: "publish over max_message_bytes", method: "POST", path: topics + "small/messages", body: strings.Repeat("x", 101), want: 413},
		{name: "publish over default 1 MiB", method: "POST", path: pub, body: strings.Repeat("x", 1<<20+1), want: 413},
		{name: "publish bad Mq-Delay-Ms", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "soon"}, want: 400},
		{name: "publish negative Mq-Delay-Ms", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "-5"}, want: 400},
		{name: "publish bad Mq-Max-Retry", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Max-Retry": "many"}, want: 400},
		{name: "publish bad Mq-Producer-Seq", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "one"}, want: 400},
		{name: "publish Idempotency-Key 257 bytes", method: "POST", path: pub, body: "x", hdr: map[string]string{"Idempotency-Key": strings.Repeat("k", 257)}, want: 400},
		{name: "batch bad JSON", method: "POST", path: pub + ":batch", body: `{"messages":[`, want: 400},
		{name: "batch unknown field", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x","valu":"y"}]}`, want: 400},
		{name: "batch 1001 messages", method: "POST", path: pub + ":batch", body: batch1001.String(), want: 413},
		// a single publish's message headers on a batch: refused, not
		// ignored (a retried batch would store every message twice)
		{name: "batch with an Idempotency-Key header", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x"}]}`, hdr: map[string]string{"Idempotency-Key": "whole-batch"}, want: 400},
		{name: "batch with an Mq-Attr header", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x"}]}`, hdr: map[string]string{"Mq-Attr-Color": "blue"}, want: 400},
		{name: "batch with Mq-Delay-Ms -5", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x"}]}`, hdr: map[string]string{"Mq-Delay-Ms": "-5"}, want: 400},
		{name: "batch with Mq-Backoff-Base-Ms", method: "POST", path: pub + ":batch", body: `{"messages":[{"value":"x"}]}`, hdr: map[string]string{"Mq-Backoff-Base-Ms": "10"}, want: 400},
		// fetch
		{name: "fetch bad JSON", method: "POST", path: fetch, body: `{"max":`, want: 400},
		{name: "fetch unknown field", method: "POST", path: fetch, body: `{"maxx":1}`, want: 400},
		{name: "fetch wrong type", method: "POST", path: fetch, body: `{"max":"10"}`, want: 400},
		{name: "fetch negative max", method: "POST", path: fetch, body: `{"max":-1}`, want: 400},
		{name: "fetch negative wait_ms", method: "POST", path: fetch, body: `{"wait_ms":-1}`, want: 400},
		{name: "fetch negative lease_ms", method: "POST", path: fetch, body: `{"lease_ms":-1}`, want: 400},
		// ack, nack, extend
		{name: "ack bad JSON", method: "POST", path: ack, body: `{"receipts":[`, want: 400},
		{name: "ack receipts not a list", method: "POST", path: ack, body: `{"receipts":"abc"}`, want: 400},
		{name: "ack unknown field", method: "POST", path: ack, body: `{"receipt":["abc"]}`, want: 400},
		{name: "nack wrong type", method: "POST", path: nack, body: `{"receipts":["abc"],"retryable":"yes"}`, want: 400},
		{name: "nack negative delay_ms", method: "POST", path: nack, body: `{"receipts":["abc"],"delay_ms":-5}`, want: 400},
		{name: "extend negative lease_ms", method: "POST", path: extend, body: `{"receipts":["abc"],"lease_ms":-1}`, want: 400},
		{name: "ack invalid receipts", method: "POST", path: ack, body: map[string]any{"receipts": []string{"garbage", "", "Zm9vYmFy", strings.Repeat("A", 300)}}, results: "invalid"},
		{name: "nack invalid receipts", method: "POST", path: nack, body: map[string]any{"receipts": []string{"garbage", "Zm9vYmFy"}, "reason": "r", "retryable": true}, results: "invalid"},
		{name: "extend invalid receipts", method: "POST", path: extend, body: map[string]any{"receipts": []string{"garbage"}, "lease_ms": 1000}, results: "invalid"},
	}
	nodes := c.Live()
	ctx := ctxFor(t, 60*time.Second)
	for i, bc := range cases {
		via := nodes[i%len(nodes)]
		h := http.Header{}
		for k, v := range bc.hdr {
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
		r, err := via.DoHeader(ctx, bc.method, bc.path, bc.body, h)
		if err != nil {
			t.Errorf("%s: %s %s via %s: no answer: %v", bc.name, bc.method, bc.path, via, err)
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
			t.Errorf("%s: %s %s via %s: status %d %s, want %s", bc.name, bc.method, shorten(bc.path), via, r.Status, shorten(string(r.Body)), want)
			continue
		}
		if _, err := r.CheckError(); err != nil {
			t.Errorf("%s: status %d: %v", bc.name, r.Status, err)
		}
		if strings.Contains(string(r.Body), secret) {
			t.Errorf("%s: the error echoes a header's value: %s", bc.name, shorten(string(r.Body)))
		}
	}
	// Every node is still healthy and serving.
	for _, n := range nodes {
		r, err := n.Do(ctx, http.MethodGet, "/healthz", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			t.Errorf("node %s /healthz after bad input: %v %v", n, r, err)
		}
		mustPublish(t, n, "bad", "still fine via "+n.ID(), nil)
	}
}

func checkResults(t *testing.T, bc badCase, via *tc.Node, r *tc.Response) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Errorf("%s via %s: status %d %s, want 200 with per-receipt %q", bc.name, via, r.Status, shorten(string(r.Body)), bc.results)
		return
	}
	var rr tc.ReceiptResults
	if err := r.JSON(&rr); err != nil {
		t.Errorf("%s: %v", bc.name, err)
		return
	}
	want := len(bc.body.(map[string]any)["receipts"].([]string))
	if len(rr.Results) != want {
		t.Errorf("%s: %d results for %d receipts: %s", bc.name, len(rr.Results), want, r.Body)
		return
	}
	for i, res := range rr.Results {
		if res.Status != bc.results {
			t.Errorf("%s: receipt %d status %q, want %q", bc.name, i, res.Status, bc.results)
		}
	}
}

func shorten(s string) string {
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
		t.Errorf("%s: unparsable answer %q: %v", name, shorten(answer), err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 400 || resp.StatusCode > 499 {
		t.Errorf("%s: status %d %s, want a 4xx", name, resp.StatusCode, shorten(string(body)))
		return
	}
	r := &tc.Response{Status: resp.StatusCode, Body: body}
	if _, err := r.CheckError(); err != nil {
		t.Errorf("%s: status %d: %v", name, resp.StatusCode, err)
	}
	if resp.Header.Get("Mq-Request-Id") == "" {
		t.Errorf("%s: the answer carries no Mq-Request-Id: %q", name, shorten(answer))
	}
}

// Requests cut short, stalled or malformed at the byte level: each is
// answered with a 4xx JSON error or has its connection closed, stores
// nothing, does not hold up other clients, and leaves the node healthy.
func testBadInputRaw(t *testing.T, c *tc.Cluster) {
	leader, _ := mustRoles(t, c)
	const topic = "bad-raw"
	mustTopic(t, leader, topic, nil)
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
			t.Errorf("%s: answer %q, want 413 request_too_large", what, shorten(ans))
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
			t.Errorf("%s: the answer echoes the request's headers: %q", l.name, shorten(ans))
		}
		if !strings.HasPrefix(ans, fmt.Sprintf("HTTP/1.1 %d ", l.want)) {
			t.Errorf("%s: answer %q, want status %d", l.name, shorten(ans), l.want)
		}
		for _, internal := range []string{"fasthttp", "buffer size", "contents", "ReadBufferSize"} {
			if strings.Contains(strings.ToLower(ans), strings.ToLower(internal)) {
				t.Errorf("%s: fasthttp's internal error text reaches the client: %q", l.name, shorten(ans))
			}
		}
	}

	// Names come from the path as sent: an encoded slash or a dot segment
	// is a bad name or no route, never a step to another topic (deleting
	// x%2F..%2Fvictim used to delete victim).
	const victim = "bad-raw-victim"
	mustTopic(t, leader, victim, nil)
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
				t.Errorf("%s: unparsable answer %q: %v", what, shorten(ans), err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			code, err := (&tc.Response{Status: resp.StatusCode, Body: body}).CheckError()
			if resp.StatusCode != p.status || code != p.code || err != nil {
				t.Errorf("%s: %d %s (%v), want %d %s", what, resp.StatusCode, shorten(string(body)), err, p.status, p.code)
			}
		}
	}
	if r, err := n.Do(ctxFor(t, 10*time.Second), http.MethodGet, "/v1/topics/"+victim, nil, nil); err != nil || r.Status != http.StatusOK {
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
	mustPublish(t, n, topic, "while a body is stalled", nil)
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
	first := mustPublish(t, n, topic, "odd key", odd)
	again := mustPublish(t, n, topic, "odd key", odd)
	if !again.Duplicate || again.Offset != first.Offset || again.Partition != first.Partition {
		t.Errorf("odd idempotency key: first %+v, repeat %+v, want the repeat to be a duplicate of the first", first, again)
	}

	// Nothing from the cut requests was stored: exactly the three publishes.
	ctx := ctxFor(t, 15*time.Second)
	// The answers written before routing are counted: under the route's
	// pattern when the body was refused from the head, else as unparsed
	// (two bodies cut short, four bad heads, one head too large).
	fams := scrape(ctx, t, n)
	for _, w := range []struct {
		route, code string
		min         float64
	}{{"/v1/topics/{topic}/messages", "413", 3}, {"unparsed", "400", 6}, {"unparsed", "431", 1}} {
		if v, _ := metricValue(fams, "mqd_http_requests_total", map[string]string{"route": w.route, "code": w.code}); v < w.min {
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
		mustPublish(t, nd, topic, "still fine after raw input via "+nd.ID(), nil)
	}
}

// Query parameters, numeric headers and dead-letter ids at their edges: a
// parameter a route does not take, one given twice, a cursor that is not
// UTF-8 once decoded, a number with a sign, a replay of id 0 are each a
// 400 with a JSON error, and none of them, nor a replay of "all" on a group
// with no dead letters, writes anything: the commit index does not move.
func TestQueryAndNumberEdgesChangeNothing(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	ctx := ctxFor(t, 60*time.Second)
	n := mustLeader(t, c)
	mustTopic(t, n, "q", nil)
	mustPublish(t, n, "q", "one", nil)
	if r, err := n.Do(ctx, http.MethodPut, "/v1/topics/q/groups/empty", nil, nil); err != nil || r.Status/100 != 2 {
		t.Fatalf("create group: %v %v", r, err)
	}
	const (
		dlq    = "/v1/topics/q/groups/empty/dlq"
		replay = dlq + "/replay"
		pub    = "/v1/topics/q/messages"
	)
	before := settledCommit(ctx, t, n)
	cases := []badCase{
		{name: "topics limit twice", method: "GET", path: "/v1/topics?limit=1&limit=2"},
		{name: "topics after twice", method: "GET", path: "/v1/topics?after=a&after=b"},
		{name: "topics unknown parameter", method: "GET", path: "/v1/topics?limt=1"},
		{name: "topics after %ff", method: "GET", path: "/v1/topics?after=%ff"},
		{name: "topics after cut UTF-8", method: "GET", path: "/v1/topics?after=caf%C3"},
		{name: "topics after overlong NUL", method: "GET", path: "/v1/topics?after=%C0%80"},
		{name: "topics parameter name %fe", method: "GET", path: "/v1/topics?a%fe=1"},
		{name: "topics limit +5", method: "GET", path: "/v1/topics?limit=+5"},
		{name: "topics limit %2B5", method: "GET", path: "/v1/topics?limit=%2B5"},
		{name: "dlq limit twice", method: "GET", path: dlq + "?limit=1&limit=2"},
		{name: "dlq after twice", method: "GET", path: dlq + "?after=1&after=2"},
		{name: "dlq key twice", method: "GET", path: dlq + "?idempotency_key=a&idempotency_key=b"},
		{name: "dlq unknown parameter", method: "GET", path: dlq + "?cursor=1"},
		{name: "dlq after %ff", method: "GET", path: dlq + "?after=%ff"},
		{name: "dlq key %ff", method: "GET", path: dlq + "?idempotency_key=%ff"},
		{name: "dlq after +1", method: "GET", path: dlq + "?after=%2B1"},
		{name: "publish takes no parameter", method: "POST", path: pub + "?partition=1", body: "x"},
		{name: "put topic takes no parameter", method: "PUT", path: "/v1/topics/q2?partitions=2", body: `{}`},
		{name: "replay takes no parameter", method: "POST", path: replay + "?all=true", body: `{"all":true}`},
		{name: "replay id 0", method: "POST", path: replay, body: `{"ids":[0]}`},
		{name: "replay ids 1 and 0", method: "POST", path: replay, body: `{"ids":[1,0]}`},
		{name: "dlq delete id +1", method: "DELETE", path: dlq + "/+1"},
		{name: "publish Mq-Delay-Ms +5", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "+5"}},
		{name: "publish Mq-Max-Retry +1", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Max-Retry": "+1"}},
		{name: "publish Mq-Backoff-Base-Ms +10", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Backoff-Base-Ms": "+10"}},
		{name: "publish Mq-Backoff-Jitter-Ms +10", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Backoff-Jitter-Ms": "+10"}},
		{name: "publish Mq-Producer-Seq +1", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Producer-Id": "p", "Mq-Producer-Seq": "+1"}},
		{name: "publish Mq-Timeout-Ms +100", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Timeout-Ms": "+100"}},
		{name: "publish Mq-Delay-Ms 5_0", method: "POST", path: pub, body: "x", hdr: map[string]string{"Mq-Delay-Ms": "5_0"}},
	}
	for _, bc := range cases {
		h := http.Header{}
		for k, v := range bc.hdr {
			h.Set(k, v)
		}
		r, err := n.DoHeader(ctx, bc.method, bc.path, bc.body, h)
		if err != nil {
			t.Fatalf("%s: %v", bc.name, err)
		}
		if r.Status != http.StatusBadRequest {
			t.Errorf("%s: %s %s: status %d %s, want 400", bc.name, bc.method, bc.path, r.Status, shorten(string(r.Body)))
			continue
		}
		if _, err := r.CheckError(); err != nil {
			t.Errorf("%s: %v", bc.name, err)
		}
	}
	mid := settledCommit(ctx, t, n)
	if mid != before {
		t.Errorf("commit index %d before the bad requests, %d after: they wrote %d entries", before, mid, mid-before)
	}
	// Nothing to replay: 200, accepted 0, and no raft entry.
	r, err := n.Do(ctx, http.MethodPost, replay, map[string]any{"all": true}, nil)
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"accepted":0`) {
		t.Fatalf("replay all of an empty dead-letter store: %v %v, want 200 accepted 0", r, err)
	}
	if r, err := n.Do(ctx, http.MethodPost, "/v1/topics/q/groups/nope/dlq/replay", map[string]any{"all": true}, nil); err != nil || r.Status != http.StatusNotFound {
		t.Errorf("replay all of a missing group: %v %v, want 404", r, err)
	}
	if after := settledCommit(ctx, t, n); after != mid {
		t.Errorf("commit index %d before the replay of all on a group with no dead letters, %d after: it wrote %d entries", mid, after, after-mid)
	}
	// Positive controls: the parameters each route takes, once each.
	for _, p := range []string{"/v1/topics?limit=1&after=", "/v1/topics?after=q", dlq + "?limit=5&after=0&idempotency_key=k"} {
		if r, err := n.Do(ctx, http.MethodGet, p, nil, nil); err != nil || r.Status != http.StatusOK {
			t.Errorf("GET %s: %v %v, want 200", p, r, err)
		}
	}
	mustPublish(t, n, "q", "two", map[string]string{"Mq-Delay-Ms": "5", "Mq-Timeout-Ms": "5000"})
}

// settledCommit answers the node's commit index once everything committed
// is applied.
func settledCommit(ctx context.Context, t *testing.T, n *tc.Node) uint64 {
	t.Helper()
	ci, err := waitView(ctx, n, "applied to commit", func(ci tc.ClusterInfo) bool {
		return ci.CommitIndex > 0 && ci.AppliedIndex >= ci.CommitIndex
	})
	if err != nil {
		t.Fatal(err)
	}
	return ci.CommitIndex
}
