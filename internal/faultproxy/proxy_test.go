package faultproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestFaults checks each fault against a backend that counts what reaches it.
func TestFaults(t *testing.T) {
	var hits atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	set := &Set{}
	p, err := New(set, 0, backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	post := func() (*http.Response, error) {
		return cl.Post(p.URL()+"/x", "text/plain", strings.NewReader("body"))
	}
	set.Reset([]Rule{
		{Method: "POST", Path: "/x", Nth: []int{1}, Fault: DropAnswer},
		{Method: "POST", Path: "/x", Nth: []int{2}, Fault: Reset},
		{Method: "POST", Path: "/x", Nth: []int{3}, Fault: Respond, Status: 503, Code: "no_leader", RetryAfter: "1"},
	})
	if _, err := post(); err == nil {
		t.Fatal("drop_answer: got an answer")
	}
	if hits.Load() != 1 {
		t.Fatalf("drop_answer: the backend saw %d requests, want 1", hits.Load())
	}
	if _, err := post(); err == nil || hits.Load() != 1 {
		t.Fatalf("reset: err %v, backend hits %d (want an error and no forward)", err, hits.Load())
	}
	r, err := post()
	if err != nil || r.StatusCode != 503 || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("respond: %v %+v", err, r)
	}
	r.Body.Close()
	r, err = post() // no rule matches the 4th: forwarded
	if err != nil || r.StatusCode != 200 || hits.Load() != 2 {
		t.Fatalf("4th request: %v %+v, backend hits %d", err, r, hits.Load())
	}
	r.Body.Close()
	recs := set.Records()
	if len(recs) != 4 || recs[0].Fault != DropAnswer || recs[3].Fault != "" || string(recs[1].Body) != "body" {
		t.Fatalf("records: %+v", recs)
	}
	p.Down()
	if _, err := post(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("down: want connection refused, got %v", err)
	}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	if r, err := post(); err != nil || r.StatusCode != 200 {
		t.Fatalf("up again: %v", err)
	}
}
