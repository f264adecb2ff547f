package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

type badCase struct {
	name   string
	method string
	path   string
	body   any // nil, string (raw) or a value sent as JSON
	hdr    map[string]string
	want   int // exact status; 0 means any 4xx
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
		// unknown things
		{name: "get unknown topic", method: "GET", path: topics + "nope", want: 404},
		{name: "publish unknown topic", method: "POST", path: topics + "nope/messages", body: "x", want: 404},
		{name: "fetch unknown topic", method: "POST", path: topics + "nope/groups/g/fetch", body: `{}`, want: 404},
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
		r, err := via.Do(ctx, bc.method, bc.path, bc.body, bc.hdr)
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
