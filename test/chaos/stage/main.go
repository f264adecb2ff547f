// Command stage is the processing stage of the chaos suite's processing
// workload (test/chaos/process.go): it consumes one topic for a group and,
// for every message, publishes one output to another topic, derived from
// the input and keyed from the input's key, through the Go client. The
// test builds it, runs several copies, SIGKILLs them, SIGSTOPs them for
// longer than their lease and restarts them at random.
//
// By default each input is settled with one process call (the client's
// ConsumeProcess): its ack and its output are one Raft command. With
// -split the stage publishes the output and then acks the input, two
// calls, the pattern process replaces: a crash or a lost lease between the
// two publishes the output again, which the suite's checker must catch.
//
// The stage reports what it sees on stdout, one JSON object a line (the
// test reads them): "handle" for each delivery, "process" for each answer
// to a process call (status, duplicate, error code), "publish" and "ack"
// in -split mode, "error" for what the client's consumer loop reported.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mqd/mqd/client"
)

func main() {
	var (
		servers = flag.String("servers", "", "comma-separated node base URLs")
		caFile  = flag.String("ca", "", "PEM file of the CA of https nodes")
		in      = flag.String("in", "", "input topic")
		group   = flag.String("group", "", "consumer group of the input topic")
		out     = flag.String("out", "", "output topic")
		lease   = flag.Duration("lease", time.Second, "lease per message (extended every third of it while the handler runs)")
		work    = flag.Duration("work", 100*time.Millisecond, "longest handler time (each input takes a time up to it, from its key)")
		conc    = flag.Int("concurrency", 4, "handlers at once")
		split   = flag.Bool("split", false, "publish the output, then ack the input: two calls instead of one process call (a broken stage)")
		name    = flag.String("name", "stage", "this copy's name, in its reports")
	)
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if *servers == "" || *in == "" || *group == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "stage: -servers, -in, -group and -out are required")
		os.Exit(2)
	}
	s, err := newStage(*servers, *caFile, *name)
	if err != nil {
		slog.Error("stage", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s.in, s.out, s.group, s.work = *in, *out, *group, *work
	o := client.ConsumeOptions{Lease: *lease, Concurrency: *conc, Wait: time.Second,
		OnError: func(err error) { s.report(map[string]any{"e": "error", "msg": err.Error()}) }}
	if *split {
		err = s.c.Consume(ctx, *in, *group, s.splitHandler, o)
	} else {
		err = s.c.ConsumeProcess(ctx, *in, *group, s.processHandler, o)
	}
	if err != nil {
		slog.Error("consume", "err", err)
		os.Exit(1)
	}
}

// stage is one running copy.
type stage struct {
	c              *client.Client
	name           string
	in, out, group string
	work           time.Duration
	mu             sync.Mutex // serializes stdout lines
	keys           sync.Map   // receipt → input key, for the transport's reports
	enc            *json.Encoder
}

func newStage(servers, caFile, name string) (*stage, error) {
	s := &stage{name: name, enc: json.NewEncoder(os.Stdout)}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca %s: no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := client.New(client.Config{Servers: strings.Split(servers, ","), Timeout: 8 * time.Second,
		MaxAttempts: 6, HTTPClient: &http.Client{Transport: &watch{s: s, next: tr}}})
	if err != nil {
		return nil, err
	}
	s.c = c
	return s, nil
}

func (s *stage) report(ev map[string]any) {
	ev["s"] = s.name
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enc.Encode(ev)
}

// Output derives the output of an input: its value names the input's key
// and the input's length; its partition key is the input's key, and, when
// the input asks for it (its value's third field is "k"), its idempotency
// key is "out-" + the input's key.
func Output(topic string, m *client.Message) client.Output {
	o := client.Output{Topic: topic, PartitionKey: m.IdempotencyKey,
		Value: fmt.Appendf(nil, "out|%s|%d", m.IdempotencyKey, len(m.Value))}
	if parts := strings.SplitN(string(m.Value), "|", 4); len(parts) == 4 && parts[2] == "k" {
		o.IdempotencyKey = "out-" + m.IdempotencyKey
	}
	return o
}

// handle is the common start of both handlers: it reports the delivery
// and works for a time derived from the key and the retry count.
func (s *stage) handle(ctx context.Context, m *client.Message) error {
	s.keys.Store(m.Receipt, m.IdempotencyKey)
	s.report(map[string]any{"e": "handle", "k": m.IdempotencyKey, "p": m.Partition, "o": m.Offset, "r": m.RetryCount})
	var h uint32
	for _, b := range []byte(m.IdempotencyKey) {
		h = h*31 + uint32(b)
	}
	d := time.Duration(uint64(h+m.RetryCount*7919) % uint64(s.work+1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s *stage) processHandler(ctx context.Context, m *client.Message) ([]client.Output, error) {
	if err := s.handle(ctx, m); err != nil && ctx.Err() == nil {
		return nil, err
	}
	// Even when the lease was lost meanwhile, answer the output: the
	// process call then refuses it as stale, which is the point.
	return []client.Output{Output(s.out, m)}, nil
}

// splitHandler publishes the output; returning nil makes Consume ack the
// input afterwards, a second call.
func (s *stage) splitHandler(ctx context.Context, m *client.Message) error {
	if err := s.handle(ctx, m); err != nil && ctx.Err() == nil {
		return err
	}
	o := Output(s.out, m)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	r, err := s.c.Publish(pctx, o.Topic, o.Value, client.PublishOptions{IdempotencyKey: o.IdempotencyKey, PartitionKey: o.PartitionKey})
	if err != nil {
		s.report(map[string]any{"e": "publish", "k": m.IdempotencyKey, "err": err.Error()})
		return err
	}
	s.report(map[string]any{"e": "publish", "k": m.IdempotencyKey, "st": 200, "dup": r.Duplicate, "p": r.Partition, "o": r.Offset})
	return nil
}

// watch is the stage's HTTP transport: it passes every request on and
// reports the answers to process and ack calls, by input key.
type watch struct {
	s    *stage
	next http.RoundTripper
}

func (w *watch) RoundTrip(r *http.Request) (*http.Response, error) {
	op := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	if op != "process" && op != "ack" {
		return w.next.RoundTrip(r)
	}
	var body []byte
	if r.GetBody != nil {
		if rc, err := r.GetBody(); err == nil {
			body, _ = io.ReadAll(rc)
			rc.Close()
		}
	}
	var req struct {
		Ack      []string `json:"ack"`
		Receipts []string `json:"receipts"`
	}
	json.Unmarshal(body, &req)
	keys := make([]string, 0, len(req.Ack)+len(req.Receipts))
	for _, rc := range append(req.Ack, req.Receipts...) {
		k, _ := w.s.keys.Load(rc)
		ks, _ := k.(string)
		keys = append(keys, ks)
	}
	resp, err := w.next.RoundTrip(r)
	if err != nil {
		w.s.report(map[string]any{"e": op, "keys": keys, "err": err.Error()})
		return nil, err
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if rerr != nil {
		w.s.report(map[string]any{"e": op, "keys": keys, "err": rerr.Error()})
		return resp, nil
	}
	var ans struct {
		Duplicate bool `json:"duplicate"`
		Results   []struct {
			Status string `json:"status"`
		} `json:"results"`
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(b, &ans)
	ev := map[string]any{"e": op, "keys": keys, "st": resp.StatusCode}
	if ans.Error != nil {
		ev["code"] = ans.Error.Code
	}
	if op == "process" {
		ev["dup"] = ans.Duplicate
	} else {
		sts := make([]string, len(ans.Results))
		for i, x := range ans.Results {
			sts[i] = x.Status
		}
		ev["statuses"] = sts
	}
	w.s.report(ev)
	return resp, nil
}
