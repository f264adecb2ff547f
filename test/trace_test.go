package test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

type keyTrace struct {
	Key         string `json:"key"`
	Partition   int    `json:"partition"`
	Offset      int64  `json:"offset"`
	PublishedAt string `json:"published_at"`
	Duplicates  int    `json:"duplicates"`
	Groups      map[string]struct {
		State      string `json:"state"`
		Deliveries int    `json:"deliveries"`
		History    []struct {
			Kind, Reason string
		} `json:"history"`
	} `json:"groups"`
}

// One message per state in group g (acked, delayed after a nack, leased,
// dead, pending) and one key published three times: GET .../keys/{key}
// and POST .../reconcile answer each through a follower, and `mqd trace`
// and `mqd reconcile` print them, the latter exiting 1 while a key is
// missing.
func TestTraceAndReconcileThroughCluster(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 120*time.Second)
	leader, followers := tc.MustRoles(t, c)
	systest.WaitFormat3(ctx, t, c)
	f := followers[0]
	tc.MustTopic(t, leader, "orders", nil)
	keys := []string{"o1", "o2", "o3", "o4", "o5"}
	for _, k := range keys {
		tc.MustPublish(t, leader, "orders", "order "+k, map[string]string{"Idempotency-Key": k})
	}
	for range 2 {
		if p := tc.MustPublish(t, f, "orders", "again", map[string]string{"Idempotency-Key": "o1"}); !p.Duplicate {
			t.Fatalf("repeat of o1 stored: %+v", p)
		}
	}
	next := func() tc.Message { return systest.RtFetchN(t, f, "orders", "g", 1, 20*time.Second, 600000)[0] }
	if m := next(); m.IdempotencyKey != "o1" || tc.AckAll(ctx, f, "orders", "g", []tc.Message{m}) != nil {
		t.Fatalf("ack of %s", m.IdempotencyKey)
	}
	if _, _, err := f.Nack(ctx, "orders", "g", []string{next().Receipt}, map[string]any{"reason": "boom", "delay_ms": 600000}); err != nil {
		t.Fatal(err)
	}
	next() // o3 stays leased
	if _, _, err := f.Nack(ctx, "orders", "g", []string{next().Receipt}, map[string]any{"reason": "bad", "retryable": false}); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		state      string
		deliveries int
		history    string
	}{"o1": {"acked", 1, ""}, "o2": {"delayed", 1, "nack:boom"}, "o3": {"leased", 1, ""}, "o4": {"dead", 1, "rejected:bad"}, "o5": {"pending", 0, ""}}
	for k, w := range want {
		r, err := f.Do(ctx, http.MethodGet, "/v1/topics/orders/keys/"+k, nil, nil)
		if err != nil || r.Expect(200) != nil {
			t.Fatalf("trace %s: %v %v", k, err, r.Expect(200))
		}
		var tr keyTrace
		if err := r.JSON(&tr); err != nil {
			t.Fatal(err)
		}
		g := tr.Groups["g"]
		var hist []string
		for _, h := range g.History {
			hist = append(hist, h.Kind+":"+h.Reason)
		}
		if tr.Key != k || tr.PublishedAt == "" || g.State != w.state || g.Deliveries != w.deliveries || strings.Join(hist, ",") != w.history {
			t.Fatalf("trace %s: %s, want state %s, %d deliveries, history %q", k, r.Body, w.state, w.deliveries, w.history)
		}
		if dup := map[bool]int{true: 2}[k == "o1"]; tr.Duplicates != dup {
			t.Fatalf("trace %s: %d duplicates, want %d", k, tr.Duplicates, dup)
		}
	}
	r, err := f.Do(ctx, http.MethodGet, "/v1/topics/orders/keys/nope", nil, nil)
	if code, _ := r.CheckError(); err != nil || r.Status != 404 || code != "key_not_found" {
		t.Fatalf("trace of an unknown key: %v %d %s", err, r.Status, r.Body)
	}

	ledger := append(slices.Clone(keys), "lost-1", "lost-2")
	r, err = f.Do(ctx, http.MethodPost, "/v1/topics/orders/reconcile", map[string]any{"keys": ledger, "group": "g"}, nil)
	if err != nil || r.Expect(200) != nil {
		t.Fatalf("reconcile: %v %v", err, r.Expect(200))
	}
	var rec tc.Reconciliation
	if err := r.JSON(&rec); err != nil {
		t.Fatal(err)
	}
	g := rec.Groups["g"]
	if !reflect.DeepEqual(rec.Missing, []string{"lost-1", "lost-2"}) || rec.Stored != 5 || len(rec.Groups) != 1 ||
		!reflect.DeepEqual(g.Acked, []string{"o1"}) || !reflect.DeepEqual(g.Pending, []string{"o2", "o5"}) ||
		!reflect.DeepEqual(g.InFlight, []string{"o3"}) || !reflect.DeepEqual(g.Dead, []string{"o4"}) {
		t.Fatalf("reconcile: %s", r.Body)
	}
	r, _ = f.Do(ctx, http.MethodPost, "/v1/topics/orders/reconcile", map[string]any{"keys": keys, "group": "nope"}, nil)
	if code, _ := r.CheckError(); r.Status != 404 || code != "group_not_found" {
		t.Fatalf("reconcile of an unknown group: %d %s", r.Status, r.Body)
	}

	srv := f.URL()
	out := systest.OK(t, srv, "", "trace", "orders", "o2")
	systest.MustContain(t, "mqd trace", out, "partition 0, offset 1", "delayed", "nack: boom")
	var tr keyTrace
	if err := json.Unmarshal([]byte(systest.OK(t, srv, "", "trace", "--json", "orders", "o4")), &tr); err != nil || tr.Groups["g"].State != "dead" {
		t.Fatalf("mqd trace --json: %v %+v", err, tr)
	}
	systest.Fails(t, srv, 1, "key_not_found", "trace", "orders", "nope")
	run := systest.RunCLI(t, srv, strings.Join(ledger, "\n")+"\n", "reconcile", "orders", "--keys-file", "-")
	if run.Code != 1 || !strings.Contains(run.Stdout, "7 keys checked against orders: 5 stored, 2 missing") ||
		!strings.Contains(run.Stdout, "missing lost-1") || !strings.Contains(run.Stderr, "2 of 7 keys missing") {
		t.Fatalf("mqd reconcile with missing keys: exit %d\n%s%s", run.Code, run.Stdout, run.Stderr)
	}
	run = systest.RunCLI(t, srv, strings.Join(keys, "\n"), "reconcile", "orders", "--group", "g", "--json", "--keys-file", "-")
	if err := json.Unmarshal([]byte(run.Stdout), &rec); run.Code != 0 || err != nil || len(rec.Missing) != 0 ||
		!reflect.DeepEqual(rec.Groups["g"].Pending, []string{"o2", "o5"}) {
		t.Fatalf("mqd reconcile --json: exit %d, %v\n%s%s", run.Code, err, run.Stdout, run.Stderr)
	}
}
