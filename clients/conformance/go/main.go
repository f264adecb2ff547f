// Command conformance-go is the Go client's driver of the client
// conformance suite (clients/conformance): it reads one case's servers,
// client options and steps as JSON on stdin, runs the steps with the Go
// client (client/), and prints one JSON line per step: {"ok":true,"value":…}
// or {"ok":false,"error":{"status","code","message"}} (status 0: no answer).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/mqd/mqd/client"
)

type input struct {
	Servers []string `json:"servers"`
	Client  struct {
		TimeoutMs   int    `json:"timeout_ms"`
		MaxAttempts int    `json:"max_attempts"`
		DeadlineMs  int    `json:"deadline_ms"`
		Token       string `json:"token"`
		CAFile      string `json:"ca_file"`
	} `json:"client"`
	Steps []step `json:"steps"`
}

type step struct {
	Op           string            `json:"op"`
	Topic        string            `json:"topic"`
	Group        string            `json:"group"`
	Value        string            `json:"value"`
	Key          string            `json:"key"`
	PartitionKey string            `json:"partition_key"`
	Attrs        map[string]string `json:"attrs"`
	MaxRetry     *int              `json:"max_retry"`
	DelayMs      int               `json:"delay_ms"`
	Max          int               `json:"max"`
	WaitMs       int               `json:"wait_ms"`
	LeaseMs      int               `json:"lease_ms"`
	Ms           int               `json:"ms"`
	Handler      string            `json:"handler"`
	Message      string            `json:"message"`
	SleepMs      int               `json:"sleep_ms"`
	Count        int               `json:"count"`
	Messages     []batchItem       `json:"messages"`
	Outputs      []batchItem       `json:"outputs"`
	OutputTopic  string            `json:"output_topic"`
}

type batchItem struct {
	Topic        string            `json:"topic"`
	Value        string            `json:"value"`
	Key          string            `json:"key"`
	PartitionKey string            `json:"partition_key"`
	Attrs        map[string]string `json:"attrs"`
}

type driver struct {
	c        *client.Client
	receipts []string
	dlqIDs   []uint64
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-go: reading the case:", err)
		os.Exit(2)
	}
	c, err := client.New(client.Config{Servers: in.Servers, Timeout: ms(in.Client.TimeoutMs), MaxAttempts: in.Client.MaxAttempts,
		Token: in.Client.Token, TLSCAFile: in.Client.CAFile})
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance-go:", err)
		os.Exit(2)
	}
	d := &driver{c: c}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for _, s := range in.Steps {
		ctx, cancel := context.WithCancel(context.Background())
		if in.Client.DeadlineMs > 0 { // the Go client's deadline is its context's
			ctx, cancel = context.WithTimeout(ctx, ms(in.Client.DeadlineMs))
		}
		v, err := d.run(ctx, s)
		cancel()
		line := map[string]any{"ok": err == nil, "value": v}
		if err != nil {
			line["error"] = describe(err)
		}
		_ = enc.Encode(line)
		_ = out.Flush()
	}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func describe(err error) map[string]any {
	var e *client.Error
	if errors.As(err, &e) {
		return map[string]any{"status": e.Status, "code": e.Code, "message": e.Error()}
	}
	return map[string]any{"status": 0, "code": "", "message": err.Error()}
}

func (d *driver) run(ctx context.Context, s step) (map[string]any, error) {
	switch s.Op {
	case "publish":
		r, err := d.c.Publish(ctx, s.Topic, []byte(s.Value), client.PublishOptions{IdempotencyKey: s.Key,
			PartitionKey: s.PartitionKey, Attrs: s.Attrs, MaxRetry: s.MaxRetry, Delay: ms(s.DelayMs)})
		if err != nil {
			return nil, err
		}
		return map[string]any{"partition": r.Partition, "offset": r.Offset, "duplicate": r.Duplicate}, nil
	case "publish_batch":
		var batch []client.BatchMessage
		for _, m := range s.Messages {
			batch = append(batch, client.BatchMessage{Value: []byte(m.Value), IdempotencyKey: m.Key, PartitionKey: m.PartitionKey, Attrs: m.Attrs})
		}
		rs, err := d.c.PublishBatch(ctx, s.Topic, batch)
		if err != nil {
			return nil, err
		}
		dups, offs := []bool{}, []uint64{}
		for _, r := range rs {
			dups, offs = append(dups, r.Duplicate), append(offs, r.Offset)
		}
		return map[string]any{"duplicates": dups, "offsets": offs}, nil
	case "fetch":
		msgs, err := d.c.Fetch(ctx, s.Topic, s.Group, client.FetchOptions{Max: s.Max, Wait: ms(s.WaitMs), Lease: ms(s.LeaseMs)})
		if err != nil {
			return nil, err
		}
		keys, counts := []string{}, []uint32{}
		d.receipts = nil
		for _, m := range msgs {
			keys, counts = append(keys, m.IdempotencyKey), append(counts, m.RetryCount)
			d.receipts = append(d.receipts, m.Receipt)
		}
		return map[string]any{"keys": keys, "retry_counts": counts}, nil
	case "ack", "nack", "extend":
		return d.settle(ctx, s)
	case "sleep":
		time.Sleep(ms(s.Ms))
		return map[string]any{}, nil
	case "process":
		return d.process(ctx, s)
	case "consume", "consume_process":
		return d.consume(ctx, s)
	case "dlq_list", "dlq_replay":
		return d.deadLetters(ctx, s)
	}
	return nil, fmt.Errorf("conformance-go: unknown op %q", s.Op)
}

// settle acks, nacks or extends the receipts of the last fetch.
func (d *driver) settle(ctx context.Context, s step) (map[string]any, error) {
	var res []client.ReceiptResult
	var err error
	switch s.Op {
	case "ack":
		res, err = d.c.Ack(ctx, s.Topic, s.Group, d.receipts...)
	case "nack":
		res, err = d.c.Nack(ctx, s.Topic, s.Group, client.NackOptions{Reason: s.Message}, d.receipts...)
	default:
		res, err = d.c.Extend(ctx, s.Topic, s.Group, ms(s.LeaseMs), d.receipts...)
	}
	if err != nil {
		return nil, err
	}
	st := []string{}
	for _, r := range res {
		st = append(st, r.Status)
	}
	return map[string]any{"statuses": st}, nil
}

// process acks the receipts of the last fetch and publishes s.Outputs in one call.
func (d *driver) process(ctx context.Context, s step) (map[string]any, error) {
	var outs []client.Output
	for _, o := range s.Outputs {
		outs = append(outs, client.Output{Topic: o.Topic, Value: []byte(o.Value), IdempotencyKey: o.Key})
	}
	r, err := d.c.Process(ctx, s.Topic, s.Group, d.receipts, outs)
	if err != nil {
		return nil, err
	}
	dups, offs := []bool{}, []uint64{}
	for _, x := range r.Results {
		dups, offs = append(dups, x.Duplicate), append(offs, x.Offset)
	}
	return map[string]any{"acked": r.Acked, "duplicate": r.Duplicate, "duplicates": dups, "offsets": offs}, nil
}

// deadLetters lists the group's dead letters (keeping their ids) or replays them.
func (d *driver) deadLetters(ctx context.Context, s step) (map[string]any, error) {
	if s.Op == "dlq_replay" {
		r, err := d.c.Replay(ctx, s.Topic, s.Group, d.dlqIDs, 0)
		if err != nil {
			return nil, err
		}
		return map[string]any{"accepted": r.Accepted}, nil
	}
	p, err := d.c.DeadLetters(ctx, s.Topic, s.Group, client.DLQOptions{})
	if err != nil {
		return nil, err
	}
	keys, reasons := []string{}, []string{}
	d.dlqIDs = nil
	for _, l := range p.DeadLetters {
		keys, reasons = append(keys, l.IdempotencyKey), append(reasons, l.RejectReason)
		d.dlqIDs = append(d.dlqIDs, l.ID)
	}
	return map[string]any{"keys": keys, "reasons": reasons}, nil
}

// consume runs the consumer loop until the handler has run s.Count times.
func (d *driver) consume(ctx context.Context, s step) (map[string]any, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	handled, reports, calls := []string{}, []string{}, 0
	h := func(hctx context.Context, m *client.Message) error {
		defer func() {
			mu.Lock()
			handled = append(handled, m.IdempotencyKey)
			if calls++; calls >= s.Count {
				cancel()
			}
			mu.Unlock()
		}()
		switch s.Handler {
		case "throw":
			return errors.New(s.Message)
		case "sleep":
			select {
			case <-time.After(ms(s.SleepMs)):
			case <-hctx.Done():
				return hctx.Err()
			}
		}
		return nil
	}
	onErr := func(err error) {
		mu.Lock()
		reports = append(reports, err.Error())
		mu.Unlock()
	}
	o := client.ConsumeOptions{Lease: ms(s.LeaseMs), Wait: ms(s.WaitMs), OnError: onErr}
	var err error
	if s.Op == "consume_process" { // one output derived from each message
		err = d.c.ConsumeProcess(ctx, s.Topic, s.Group, func(hctx context.Context, m *client.Message) ([]client.Output, error) {
			if err := h(hctx, m); err != nil {
				return nil, err
			}
			return []client.Output{{Topic: s.OutputTopic, Value: append([]byte("out-"), m.Value...), IdempotencyKey: "out-" + m.IdempotencyKey}}, nil
		}, o)
	} else {
		err = d.c.Consume(ctx, s.Topic, s.Group, h, o)
	}
	mu.Lock()
	defer mu.Unlock()
	return map[string]any{"handled": handled, "errors": reports}, err
}
