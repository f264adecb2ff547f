package client

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustNew(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	if status == 503 {
		w.Header().Set("Retry-After", "0")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// deadAddr returns an address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A publish with an idempotency key that meets 503s is sent again with the
// same key until it is stored.
func TestPublishRetriesWithSameKey(t *testing.T) {
	var keys []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if body, _ := io.ReadAll(r.Body); string(body) != "hello" {
			t.Errorf("attempt %d: body %q", n, body)
		}
		if n < 3 {
			writeErr(w, 503, "no_quorum", "no quorum")
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"topic":"t","partition":2,"offset":7,"duplicate":false}`)
	}))
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}})
	r, err := c.Publish(ctxFor(t, 10*time.Second), "t", []byte("hello"), PublishOptions{IdempotencyKey: "k-1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Partition != 2 || r.Offset != 7 {
		t.Errorf("result %+v", r)
	}
	if strings.Join(keys, ",") != "k-1,k-1,k-1" {
		t.Errorf("keys sent: %q, want k-1 three times", keys)
	}
}

// Without a key, a publish that reached a node is not sent again: a 503
// comes back to the caller as a retryable *Error after one attempt.
func TestPublishWithoutKeyNotResent(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeErr(w, 503, "no_quorum", "no quorum within the deadline")
	}))
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}})
	_, err := c.Publish(ctxFor(t, 10*time.Second), "t", []byte("x"), PublishOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Code != "no_quorum" || e.Status != 503 || !IsRetryable(err) {
		t.Fatalf("err %v, want a retryable *Error no_quorum", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d attempts, want 1", calls.Load())
	}
}

// A node that refuses connections is skipped: the request goes to the next
// node of the list, even a publish without a key (it was never sent).
func TestFailoverToNextNode(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(201)
		io.WriteString(w, `{"topic":"t","partition":0,"offset":1,"duplicate":false}`)
	}))
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{deadAddr(t), srv.URL}})
	if _, err := c.Publish(ctxFor(t, 10*time.Second), "t", []byte("x"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	// The client now stays with the node that answered.
	if _, err := c.Publish(ctxFor(t, 10*time.Second), "t", []byte("y"), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 {
		t.Errorf("live node got %d requests, want 2", calls.Load())
	}
}

// With every node down, a request gives up after MaxAttempts with a
// TransportError (retryable), not hanging.
func TestAllNodesDown(t *testing.T) {
	c := mustNew(t, Config{Servers: []string{deadAddr(t), deadAddr(t)}, MaxAttempts: 4})
	_, err := c.Topics(ctxFor(t, 10*time.Second))
	var te *TransportError
	if !errors.As(err, &te) || !IsRetryable(err) {
		t.Fatalf("err %v, want a TransportError", err)
	}
}

// Error answers become *Error with the broker's code and message; 4xx are
// not retried; the bearer token is sent.
func TestTypedErrorAndToken(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			writeErr(w, 401, "unauthenticated", "no token")
			return
		}
		writeErr(w, 404, "topic_not_found", "topic nope does not exist")
	}))
	defer srv.Close()
	c := mustNew(t, Config{Servers: []string{srv.URL}, Token: "s3cret"})
	_, err := c.Topic(ctxFor(t, 10*time.Second), "nope")
	var e *Error
	if !errors.As(err, &e) || e.Status != 404 || e.Message != "topic nope does not exist" || !IsCode(err, "topic_not_found") {
		t.Fatalf("err %#v", err)
	}
	if IsRetryable(err) || calls.Load() != 1 {
		t.Errorf("a 404 was retried (%d calls) or called retryable", calls.Load())
	}
}

// --tls-ca: an https server is trusted with its CA in a PEM file, and not
// without it.
func TestTLSCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"topics":[{"name":"a"}]}`)
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	c := mustNew(t, Config{Servers: []string{srv.URL}, TLSCAFile: caFile})
	ts, err := c.Topics(ctxFor(t, 10*time.Second))
	if err != nil || len(ts) != 1 || ts[0].Name != "a" {
		t.Fatalf("with the CA: %v %v", ts, err)
	}
	c = mustNew(t, Config{Servers: []string{srv.URL}, MaxAttempts: 1})
	if _, err := c.Topics(ctxFor(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: err %v, want a certificate error", err)
	}
	if _, err := New(Config{TLSCAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil {
		t.Error("a missing CA file was accepted")
	}
	if err := os.WriteFile(caFile, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{TLSCAFile: caFile}); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
}

func TestNormalizeServers(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7070":          "http://127.0.0.1:7070",
		"http://h:1/":             "http://h:1",
		"https://mq.example:7070": "https://mq.example:7070",
	} {
		if got, err := normalize(in); err != nil || got != want {
			t.Errorf("normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://h:1", "http://"} {
		if _, err := normalize(bad); err == nil {
			t.Errorf("normalize(%q) accepted", bad)
		}
	}
}
