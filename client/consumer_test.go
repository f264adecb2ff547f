package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeGroup is a broker double for one group: it hands out its messages
// once, and records extends, acks and nacks.
type fakeGroup struct {
	mu       sync.Mutex
	pending  []string // values not yet fetched
	extends  map[string]int
	acked    []string
	nacks    map[string]map[string]any
	staleExt bool // answer extends "stale"
	settled  chan struct{}
}

func (f *fakeGroup) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	defer f.mu.Unlock()
	op := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	receipts := func() []string {
		var out []string
		for _, x := range body["receipts"].([]any) {
			out = append(out, x.(string))
		}
		return out
	}
	results := func(status string) {
		var rs []map[string]string
		for _, rc := range receipts() {
			rs = append(rs, map[string]string{"receipt": rc, "status": status})
		}
		json.NewEncoder(w).Encode(map[string]any{"results": rs})
	}
	switch op {
	case "fetch":
		max := int(body["max"].(float64))
		var msgs []map[string]any
		for len(f.pending) > 0 && len(msgs) < max {
			v := f.pending[0]
			f.pending = f.pending[1:]
			msgs = append(msgs, map[string]any{"topic": "t", "receipt": "r-" + v,
				"value_b64": base64.StdEncoding.EncodeToString([]byte(v))})
		}
		if msgs == nil {
			f.mu.Unlock()
			time.Sleep(20 * time.Millisecond) // a short long-poll
			f.mu.Lock()
			msgs = []map[string]any{}
		}
		json.NewEncoder(w).Encode(map[string]any{"messages": msgs})
	case "extend":
		f.extends[receipts()[0]]++
		if f.staleExt {
			results(StatusStale)
			return
		}
		results(StatusOK)
	case "ack":
		f.acked = append(f.acked, receipts()...)
		results(StatusOK)
		f.settled <- struct{}{}
	case "nack":
		f.nacks[receipts()[0]] = body
		results(StatusOK)
		f.settled <- struct{}{}
	}
}

// Consume acks what the handler finished, nacks with the error's text what
// it failed (not retryable for Reject), and extends the lease while a slow
// handler runs.
func TestConsumeAckNackExtend(t *testing.T) {
	f := &fakeGroup{pending: []string{"ok", "slow", "fail", "poison"}, extends: map[string]int{},
		nacks: map[string]map[string]any{}, settled: make(chan struct{}, 10)}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}})
	ctx, cancel := context.WithCancel(ctxFor(t, 20*time.Second))
	done := make(chan error, 1)
	var onErr []error
	var mu sync.Mutex
	go func() {
		done <- c.Consume(ctx, "t", "g", func(ctx context.Context, m *Message) error {
			switch string(m.Value) {
			case "slow":
				time.Sleep(350 * time.Millisecond) // > 3 extend periods of 100 ms
				return nil
			case "fail":
				return fmt.Errorf("payment service down")
			case "poison":
				return Reject(errors.New("cannot parse"))
			}
			return nil
		}, ConsumeOptions{Lease: 300 * time.Millisecond, Concurrency: 2, Wait: 50 * time.Millisecond,
			OnError: func(err error) { mu.Lock(); onErr = append(onErr, err); mu.Unlock() }})
	}()
	for range 4 {
		select {
		case <-f.settled:
		case <-time.After(10 * time.Second):
			t.Fatal("messages not all settled within 10 s")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.Join(f.acked, ",") != "r-ok,r-slow" && strings.Join(f.acked, ",") != "r-slow,r-ok" {
		t.Errorf("acked %v, want r-ok and r-slow", f.acked)
	}
	if n := f.extends["r-slow"]; n < 2 {
		t.Errorf("slow handler's lease extended %d times, want >= 2", n)
	}
	if n := f.nacks["r-fail"]; n == nil || n["reason"] != "payment service down" || n["retryable"] != true {
		t.Errorf("nack of fail: %v", n)
	}
	if n := f.nacks["r-poison"]; n == nil || n["retryable"] != false || !strings.Contains(n["reason"].(string), "cannot parse") {
		t.Errorf("nack of poison: %v", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(onErr) != 0 {
		t.Errorf("errors reported: %v", onErr)
	}
}

// A lease that cannot be extended (stale) ends the handler's context with
// ErrLeaseLost, and its message is neither acked nor nacked.
func TestConsumeLeaseLost(t *testing.T) {
	f := &fakeGroup{pending: []string{"slow"}, extends: map[string]int{}, nacks: map[string]map[string]any{},
		settled: make(chan struct{}, 10), staleExt: true}
	srv := httptest.NewServer(f)
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}})
	ctx, cancel := context.WithCancel(ctxFor(t, 20*time.Second))
	defer cancel()
	causes := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, "t", "g", func(hctx context.Context, m *Message) error {
			select {
			case <-hctx.Done():
				causes <- context.Cause(hctx)
			case <-time.After(5 * time.Second):
				causes <- errors.New("handler context not ended")
			}
			return hctx.Err()
		}, ConsumeOptions{Lease: 90 * time.Millisecond, Wait: 50 * time.Millisecond})
	}()
	if err := <-causes; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("handler context cause %v, want ErrLeaseLost", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.acked) != 0 || len(f.nacks) != 0 {
		t.Errorf("a message whose lease was lost was settled: acked %v nacked %v", f.acked, f.nacks)
	}
}

// A fetch refused for good (unknown topic) ends Consume with that error.
func TestConsumeStopsOnPermanentError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 404, "topic_not_found", "no such topic")
	}))
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}})
	err := c.Consume(ctxFor(t, 10*time.Second), "t", "g", func(context.Context, *Message) error { return nil }, ConsumeOptions{})
	if !IsCode(err, "topic_not_found") {
		t.Fatalf("err %v", err)
	}
}
