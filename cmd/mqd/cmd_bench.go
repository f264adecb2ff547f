package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqd/mqd/client"
)

func init() {
	register(&command{name: "bench", longRunning: true, summary: "load a broker; a live progress line, then throughput and latency percentiles",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var b bench
			fs.IntVar(&b.publishers, "publishers", 4, "concurrent publishers (one request at a time each)")
			fs.IntVar(&b.consumers, "consumers", 4, "concurrent consumers (fetch up to 100, ack them in one request)")
			fs.IntVar(&b.size, "size", 256, "payload bytes per message (at least 8: a timestamp for end-to-end latency)")
			fs.DurationVar(&b.duration, "duration", 10*time.Second, "how long to publish")
			fs.BoolVar(&b.keyed, "key", false, "publish with a unique Idempotency-Key per message (dedup index cost)")
			fs.StringVar(&b.topic, "topic", "", "topic to use (default: a new bench-* topic, deleted afterwards)")
			fs.IntVar(&b.partitions, "partitions", 4, "partitions of the new topic")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 0, "no arguments"); err != nil {
					return err
				}
				if b.publishers < 1 || b.consumers < 0 || b.size < 8 || b.duration <= 0 || b.partitions < 1 {
					return usageErr("want --publishers >= 1, --consumers >= 0, --size >= 8, --duration > 0, --partitions >= 1")
				}
				b.c = c
				return b.run(ctx)
			}
		}})
}

// drainLimit bounds how long consumers keep going after the publishers stop.
const drainLimit = 30 * time.Second

type bench struct {
	c                                       *cli
	publishers, consumers, size, partitions int
	duration                                time.Duration
	keyed                                   bool
	topic                                   string

	published, consumed, errs atomic.Int64
	pubDone                   atomic.Bool
	mu                        sync.Mutex
	pubLat, e2eLat            []time.Duration
	lastConsumed              atomic.Int64 // unix nanos
}

func (b *bench) run(ctx context.Context) error {
	own := b.topic == ""
	if own {
		b.topic = "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if _, _, err := b.c.client.PutTopic(ctx, b.topic, client.TopicConfig{"partitions": b.partitions}); err != nil {
		return fmt.Errorf("creating topic %s: %w", b.topic, err)
	}
	if own {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), client.DefaultTimeout)
			defer cancel()
			if err := b.c.client.DeleteTopic(dctx, b.topic); err != nil {
				fmt.Fprintf(b.c.stderr, "mqd: deleting topic %s: %v\n", b.topic, err)
			}
		}()
	}
	if b.consumers > 0 {
		if err := b.c.client.PutGroup(ctx, b.topic, "bench"); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	var pubs, cons sync.WaitGroup
	for i := range b.publishers {
		pubs.Add(1)
		go func() { defer pubs.Done(); b.publish(ctx, cancel, start.Add(b.duration), i) }()
	}
	for range b.consumers {
		cons.Add(1)
		go func() { defer cons.Done(); b.consume(ctx, cancel, start.Add(b.duration+drainLimit)) }()
	}
	stopProgress := b.progress(start)
	pubs.Wait()
	pubEnd := time.Since(start)
	b.pubDone.Store(true)
	cons.Wait()
	stopProgress()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return b.report(pubEnd, start)
}

func (b *bench) publish(ctx context.Context, fail context.CancelCauseFunc, until time.Time, worker int) {
	payload := make([]byte, b.size)
	lat := make([]time.Duration, 0, 4096)
	defer func() { b.mu.Lock(); b.pubLat = append(b.pubLat, lat...); b.mu.Unlock() }()
	for seq := 0; ctx.Err() == nil && time.Now().Before(until); seq++ {
		var o client.PublishOptions
		if b.keyed {
			o.IdempotencyKey = b.topic + "-" + strconv.Itoa(worker) + "-" + strconv.Itoa(seq)
		}
		t0 := time.Now()
		binary.BigEndian.PutUint64(payload, uint64(t0.UnixNano()))
		_, err := b.c.client.Publish(ctx, b.topic, payload, o)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !client.IsRetryable(err) {
				fail(fmt.Errorf("publish: %w", err))
				return
			}
			b.errs.Add(1)
			continue
		}
		lat = append(lat, time.Since(t0))
		b.published.Add(1)
	}
}

func (b *bench) consume(ctx context.Context, fail context.CancelCauseFunc, until time.Time) {
	lat := make([]time.Duration, 0, 4096)
	defer func() { b.mu.Lock(); b.e2eLat = append(b.e2eLat, lat...); b.mu.Unlock() }()
	for ctx.Err() == nil && time.Now().Before(until) {
		if b.pubDone.Load() && b.consumed.Load() >= b.published.Load() {
			return
		}
		msgs, err := b.c.client.Fetch(ctx, b.topic, "bench", client.FetchOptions{Max: 100, Wait: 500 * time.Millisecond})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !client.IsRetryable(err) {
				fail(fmt.Errorf("fetch: %w", err))
				return
			}
			b.errs.Add(1)
			continue
		}
		if len(msgs) == 0 {
			continue
		}
		now := time.Now()
		receipts := make([]string, len(msgs))
		for i, m := range msgs {
			receipts[i] = m.Receipt
			if len(m.Value) >= 8 {
				lat = append(lat, now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(m.Value)))))
			}
		}
		if _, err := b.c.client.Ack(ctx, b.topic, "bench", receipts...); err != nil {
			if ctx.Err() != nil {
				return
			}
			b.errs.Add(1)
			continue
		}
		b.consumed.Add(int64(len(msgs)))
		b.lastConsumed.Store(time.Now().UnixNano())
	}
}

// progress rewrites one status line every second while stdout is a
// terminal; the returned func stops it.
func (b *bench) progress(start time.Time) func() {
	if !isTerminal(b.c.stdout) {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var lastPub, lastCon int64
		for {
			select {
			case <-done:
				fmt.Fprint(b.c.stdout, "\r\033[K")
				return
			case <-t.C:
			}
			p, c := b.published.Load(), b.consumed.Load()
			fmt.Fprintf(b.c.stdout, "\r\033[K%4.0fs  published %d (%d/s)  consumed %d (%d/s)  errors %d",
				time.Since(start).Seconds(), p, p-lastPub, c, c-lastCon, b.errs.Load())
			lastPub, lastCon = p, c
		}
	}()
	return func() { close(done); wg.Wait() }
}

// isTerminal reports whether f is an *os.File on a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

type benchReport struct {
	Topic             string  `json:"topic"`
	Publishers        int     `json:"publishers"`
	Consumers         int     `json:"consumers"`
	Size              int     `json:"size"`
	Keyed             bool    `json:"keyed"`
	Published         int64   `json:"published"`
	Consumed          int64   `json:"consumed"`
	Errors            int64   `json:"errors"`
	PublishSeconds    float64 `json:"publish_seconds"`
	PublishPerSec     float64 `json:"publish_per_sec"`
	PublishMBPerSec   float64 `json:"publish_mb_per_sec"`
	ConsumePerSec     float64 `json:"consume_per_sec"`
	PublishLatencyMs  latency `json:"publish_latency_ms"`
	EndToEndLatencyMs latency `json:"end_to_end_latency_ms"`
}

type latency struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

func (b *bench) report(pubEnd time.Duration, start time.Time) error {
	r := benchReport{Topic: b.topic, Publishers: b.publishers, Consumers: b.consumers, Size: b.size, Keyed: b.keyed,
		Published: b.published.Load(), Consumed: b.consumed.Load(), Errors: b.errs.Load(), PublishSeconds: pubEnd.Seconds(),
		PublishLatencyMs: percentiles(b.pubLat), EndToEndLatencyMs: percentiles(b.e2eLat)}
	r.PublishPerSec = float64(r.Published) / pubEnd.Seconds()
	r.PublishMBPerSec = r.PublishPerSec * float64(b.size) / 1e6
	if last := b.lastConsumed.Load(); last > 0 {
		r.ConsumePerSec = float64(r.Consumed) / time.Unix(0, last).Sub(start).Seconds()
	}
	if b.c.json {
		b.c.printJSON(marshalLine(r))
		return nil
	}
	w := b.c.table()
	keys := "no idempotency keys"
	if r.Keyed {
		keys = "a unique idempotency key each"
	}
	fmt.Fprintf(w, "topic %s: %s, %s, %s, %s\n\n", r.Topic, plural(r.Publishers, "publisher"), plural(r.Consumers, "consumer"),
		fmt.Sprintf("%d-byte messages", r.Size), keys)
	fmt.Fprintf(w, "published\t%d in %.1fs\t%.0f msg/s\t%.2f MB/s\n", r.Published, r.PublishSeconds, r.PublishPerSec, r.PublishMBPerSec)
	if b.consumers > 0 {
		fmt.Fprintf(w, "consumed\t%d\t%.0f msg/s\t\n", r.Consumed, r.ConsumePerSec)
	}
	fmt.Fprintf(w, "errors\t%d\t\t\n\n", r.Errors)
	fmt.Fprintln(w, "latency (ms)\tp50\tp99\tp999\tmax")
	l := r.PublishLatencyMs
	fmt.Fprintf(w, "publish\t%.2f\t%.2f\t%.2f\t%.2f\n", l.P50, l.P99, l.P999, l.Max)
	if b.consumers > 0 {
		l = r.EndToEndLatencyMs
		fmt.Fprintf(w, "end to end\t%.2f\t%.2f\t%.2f\t%.2f\n", l.P50, l.P99, l.P999, l.Max)
	}
	return w.Flush()
}

// percentiles by nearest rank, in milliseconds.
func percentiles(d []time.Duration) latency {
	if len(d) == 0 {
		return latency{}
	}
	slices.Sort(d)
	at := func(q float64) float64 {
		i := int(q*float64(len(d))+0.999999) - 1
		return float64(d[min(max(i, 0), len(d)-1)]) / 1e6
	}
	return latency{P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: float64(d[len(d)-1]) / 1e6}
}
