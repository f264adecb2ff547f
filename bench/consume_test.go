// Consume benchmarks on a three-node cluster of real mqd processes, through
// the leader, 1 KiB payloads.
//
//	go test -run '^$' -bench ConsumeAck -benchtime 50000x ./bench/     # backlog of b.N, 4 consumers fetch 100 + ack
//	go test -run '^$' -bench EndToEnd ./bench/                         # 1000 msgs/s for 10 s, long-polling consumers
//	go test -run '^$' -bench EndToEnd ./bench/ -e2e.rate=3000 -e2e.duration=20s
//	go test -run '^$' -bench DelayedLateness ./bench/                  # 20k messages, Mq-Delay-Ms over 200ms..3.2s
//	go test -run '^$' -bench DelayedLateness ./bench/ -delayed.msgs=50000 -delayed.spread=5s
//
// ConsumeAck: b.N is the number of messages; it reports msgs/s acked, the
// CPU of the cluster's node processes and of its leader per message
// (cpu_us/msg, leader_cpu_us/msg), and the latency of a fetch+ack round
// (fetch sent to ack answered) p50/p99/p999.
// EndToEnd and DelayedLateness ignore b.N (see fixed): EndToEnd reports the
// delivered msgs/s and publish-to-delivery p50/p99/p999; DelayedLateness
// reports the publish msgs/s (its load) and the lateness percentiles.

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// consumers runs n consumers of a group until ctx ends. Each one fetches
// (max, waitMs), hands the messages to got with the time the answer
// arrived, and acks them: in line before its next fetch (async false), or
// through an acker goroutine of its own (async true), so that acking does
// not delay the next fetch. acked is called with the number of receipts
// acked ok. wait stops nothing: it waits for the consumers to end after ctx
// has, and returns the fetch+ack round latencies (fetch latencies when
// async) and the first error.
func (s *system) consumers(ctx context.Context, topic, group string, n, max, waitMs int, async bool,
	got func(msgs []tc.Message, at time.Time), acked func(int)) (wait func() ([]time.Duration, error)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lat   []time.Duration
		first atomic.Value
	)
	fail := func(err error) { first.CompareAndSwap(nil, err.Error()) }
	ack := func(receipts []string) {
		actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, _, err := s.leader.Ack(actx, topic, group, receipts)
		if err != nil {
			fail(fmt.Errorf("ack: %w", err))
			return
		}
		ok := 0
		for _, r := range res {
			if r.Status == "ok" {
				ok++
			}
		}
		if ok != len(receipts) {
			fail(fmt.Errorf("ack: %d of %d receipts not ok", len(receipts)-ok, len(receipts)))
		}
		if acked != nil {
			acked(ok)
		}
	}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local []time.Duration
			var acks chan []string
			var ackers sync.WaitGroup
			if async {
				acks = make(chan []string, 64)
				ackers.Go(func() {
					for rs := range acks {
						ack(rs)
					}
				})
			}
			defer func() {
				if async {
					close(acks)
					ackers.Wait()
				}
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}()
			for ctx.Err() == nil {
				t0 := time.Now()
				msgs, _, err := s.leader.Fetch(ctx, topic, group, tc.FetchRequest{Max: max, WaitMs: waitMs})
				at := time.Now()
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("fetch: %w", err))
						time.Sleep(100 * time.Millisecond)
					}
					continue
				}
				if len(msgs) == 0 {
					continue
				}
				if got != nil {
					got(msgs, at)
				}
				receipts := make([]string, len(msgs))
				for i, m := range msgs {
					receipts[i] = m.Receipt
				}
				if async {
					acks <- receipts
					local = append(local, at.Sub(t0))
				} else {
					ack(receipts)
					local = append(local, time.Since(t0))
				}
			}
		}()
	}
	return func() ([]time.Duration, error) {
		wg.Wait()
		if e := first.Load(); e != nil {
			return lat, fmt.Errorf("consumers: %v", e)
		}
		return lat, nil
	}
}

// BenchmarkConsumeAck drains a backlog: b.N messages are published first
// (in batches, outside the timer), then 4 consumers fetch up to 100 at a
// time (long-poll 200 ms) and ack each fetch's receipts in one request
// before fetching again, until all b.N are acked.
func BenchmarkConsumeAck(b *testing.B) {
	s := startSystem(b, 3)
	const consumers, max = 4, 100
	b.Run(fmt.Sprintf("consumers=%d/max=%d", consumers, max), func(b *testing.B) {
		b.StopTimer()
		topic := s.topic(b, "consume", nil)
		s.putGroup(b, topic, "g")
		s.backlog(b, topic, b.N, payloadSize)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var total atomic.Int64
		var end time.Time
		done := make(chan struct{})
		var cpuEnd cpuSample
		fs, err := s.c.Followers(context.Background())
		if err != nil || len(fs) != 2 {
			b.Fatalf("followers: %v %v", fs, err)
		}
		prof := profileNodes(b, map[string]*tc.Node{"leader": s.leader, "follower1": fs[0], "follower2": fs[1]})
		b.StartTimer()
		cpuStart := s.cpu()
		start := time.Now()
		wait := s.consumers(ctx, topic, "g", consumers, max, 200, false, nil, func(n int) {
			if total.Add(int64(n)) == int64(b.N) {
				end = time.Now()
				cpuEnd = s.cpu()
				close(done)
			}
		})
		select {
		case <-done:
		case <-time.After(time.Minute + time.Duration(b.N)*time.Millisecond):
			cancel()
			_, err := wait()
			b.Fatalf("only %d of %d messages acked in time (%v)", total.Load(), b.N, err)
		}
		b.StopTimer()
		cancel()
		lat, err := wait()
		prof()
		if err != nil {
			b.Fatal(err)
		}
		elapsed := end.Sub(start)
		ms := append([]metric{{float64(b.N) / elapsed.Seconds(), "msgs/s"}}, cpuMetrics(cpuStart, cpuEnd, b.N)...)
		report(b, append(ms, latencyMetrics("", lat)...))
	})
}

// stamp writes three numbers (id and two times or durations) as fixed-width
// decimals at the start of a payload; unstamp reads them back.
func stamp(p []byte, a, b, c int64) {
	copy(p, fmt.Appendf(nil, "%020d%020d%020d", a, b, c))
}

func unstamp(m tc.Message) (a, b, c int64, err error) {
	v, err := m.Value()
	if err != nil {
		return 0, 0, 0, err
	}
	if len(v) < 60 {
		return 0, 0, 0, fmt.Errorf("payload of %d bytes has no stamp", len(v))
	}
	out := [3]int64{}
	for i := range out {
		if out[i], err = strconv.ParseInt(string(v[20*i:20*i+20]), 10, 64); err != nil {
			return 0, 0, 0, err
		}
	}
	return out[0], out[1], out[2], nil
}

// receiver counts first deliveries of stamped messages 0..n-1 and records a
// latency for each, computed by f from the stamp, the message and the
// arrival time; done is closed when all n have arrived.
type receiver struct {
	f    func(a, b, c int64, m tc.Message, at time.Time) time.Duration
	seen []atomic.Bool
	got  atomic.Int64
	done chan struct{}

	mu    sync.Mutex
	lat   []time.Duration
	extra []time.Duration // a second figure per message, if f2 is set
	f2    func(a, b, c int64, m tc.Message, at time.Time) time.Duration
	last  time.Time
	err   error
}

func newReceiver(n int, f func(a, b, c int64, m tc.Message, at time.Time) time.Duration) *receiver {
	return &receiver{f: f, seen: make([]atomic.Bool, n), done: make(chan struct{})}
}

func (r *receiver) add(msgs []tc.Message, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		a, b, c, err := unstamp(m)
		if err == nil && (a < 0 || a >= int64(len(r.seen))) {
			err = fmt.Errorf("message id %d out of range", a)
		}
		if err != nil {
			if r.err == nil {
				r.err = err
			}
			continue
		}
		if r.seen[a].Swap(true) {
			continue // a redelivery
		}
		r.lat = append(r.lat, r.f(a, b, c, m, at))
		if r.f2 != nil {
			r.extra = append(r.extra, r.f2(a, b, c, m, at))
		}
		r.last = at
		if r.got.Add(1) == int64(len(r.seen)) {
			close(r.done)
		}
	}
}

// await waits until every message arrived or timeout passed.
func (r *receiver) await(b *testing.B, timeout time.Duration) {
	b.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		b.Fatalf("only %d of %d messages delivered within %v", r.got.Load(), len(r.seen), timeout)
	}
	if r.err != nil {
		b.Fatal(r.err)
	}
}

// BenchmarkEndToEnd publishes at a steady -e2e.rate (default 1000 msgs/s,
// about a seventh of what 64 publishers reach here) for -e2e.duration from
// 16 publishers, while 4 consumers long-poll (max 100, wait 1 s) and ack
// from a goroutine of their own. Each payload carries its send time; the
// latency is the fetch answer's arrival minus that: publish (commit on a
// majority) + wake-up of the long poll + lease (a raft round) + transfer.
func BenchmarkEndToEnd(b *testing.B) {
	s := startSystem(b, 3)
	b.Run(fmt.Sprintf("rate=%d", *flagRate), func(b *testing.B) {
		fixed(b, func(b *testing.B) []metric {
			total := int(float64(*flagRate) * flagE2EDur.Seconds())
			topic := s.topic(b, "e2e", nil)
			s.putGroup(b, topic, "g")
			rcv := newReceiver(total, func(_, sent, _ int64, _ tc.Message, at time.Time) time.Duration {
				return at.Sub(time.Unix(0, sent))
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wait := s.consumers(ctx, topic, "g", 4, 100, 1000, true, rcv.add, nil)
			time.Sleep(200 * time.Millisecond) // let the consumers start their long polls

			interval := time.Second / time.Duration(*flagRate)
			start := time.Now()
			var next atomic.Int64
			paced := func() (int64, bool) {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return i, false
				}
				time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
				return i, true
			}
			url := s.url(topic, "/messages")
			_, pubLat, _, err := driver{workers: 16, next: paced}.run(func(_ int, i int64) (int, error) {
				p := payload(payloadSize)
				stamp(p, i, time.Now().UnixNano(), 0)
				_, err := s.post(context.Background(), url, p, nil, http.StatusCreated)
				return 1, err
			})
			if err != nil {
				b.Fatal(err)
			}
			rcv.await(b, 60*time.Second)
			cancel()
			if _, err := wait(); err != nil {
				b.Fatal(err)
			}
			out := []metric{{float64(total) / rcv.last.Sub(start).Seconds(), "msgs/s"}}
			out = append(out, latencyMetrics("", rcv.lat)...)
			pub := latencyMetrics("pub_", pubLat)
			return append(out, pub[0], pub[1])
		})
	})
}

// BenchmarkDelayedLateness publishes -delayed.msgs messages (default 20k)
// as fast as 32 publishers go, each with an Mq-Delay-Ms drawn uniformly from
// [200 ms, 200 ms + -delayed.spread] (default 3 s), while 4 consumers
// long-poll (max 100, wait 1 s) and ack from a goroutine of their own.
// Lateness is the fetch answer's arrival minus the due time, taken as the
// client's send time + the delay (it includes the request's way to the
// leader, which stamps the real due time); srv_ figures take the due time
// from the message's published_at (the leader's clock, ms) + the delay.
// msgs/s is the publish rate: the load the deliveries happen under.
func BenchmarkDelayedLateness(b *testing.B) {
	s := startSystem(b, 3)
	b.Run(fmt.Sprintf("msgs=%d/spread=%v", *flagDelMsg, *flagDelSpr), func(b *testing.B) {
		fixed(b, func(b *testing.B) []metric {
			total := *flagDelMsg
			topic := s.topic(b, "delayed", nil)
			s.putGroup(b, topic, "g")
			rcv := newReceiver(total, func(_, _, due int64, _ tc.Message, at time.Time) time.Duration {
				return at.Sub(time.Unix(0, due))
			})
			var badTime atomic.Value
			rcv.f2 = func(_, delayMs, _ int64, m tc.Message, at time.Time) time.Duration {
				pub, err := time.Parse(time.RFC3339Nano, m.PublishedAt)
				if err != nil {
					badTime.CompareAndSwap(nil, err.Error())
				}
				return at.Sub(pub.Add(time.Duration(delayMs) * time.Millisecond))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wait := s.consumers(ctx, topic, "g", 4, 100, 1000, true, rcv.add, nil)
			time.Sleep(200 * time.Millisecond)

			const publishers = 32
			rngs := make([]*rand.Rand, publishers)
			for i := range rngs {
				rngs[i] = rand.New(rand.NewPCG(uint64(i), 42))
			}
			spreadMs := flagDelSpr.Milliseconds()
			url := s.url(topic, "/messages")
			n, _, pubElapsed, err := driver{workers: publishers, next: untilN(total)}.run(func(w int, i int64) (int, error) {
				delay := 200 + rngs[w].Int64N(spreadMs+1)
				p := payload(payloadSize)
				sent := time.Now()
				stamp(p, i, delay, sent.Add(time.Duration(delay)*time.Millisecond).UnixNano())
				_, err := s.post(context.Background(), url, p, map[string]string{"Mq-Delay-Ms": strconv.FormatInt(delay, 10)}, http.StatusCreated)
				return 1, err
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Logf("published %d delayed messages in %v", n, pubElapsed.Round(time.Millisecond))
			rcv.await(b, *flagDelSpr+60*time.Second)
			cancel()
			if _, err := wait(); err != nil {
				b.Fatal(err)
			}
			if e := badTime.Load(); e != nil {
				b.Fatalf("published_at: %v", e)
			}
			out := []metric{{float64(n) / pubElapsed.Seconds(), "msgs/s"}}
			out = append(out, latencyMetrics("", rcv.lat)...)
			lmax := rcv.lat[0]
			lmin := rcv.lat[0]
			for _, l := range rcv.lat {
				lmax, lmin = max(lmax, l), min(lmin, l)
			}
			out = append(out, metric{ms(lmax), "max_ms"}, metric{ms(lmin), "min_ms"})
			srv := latencyMetrics("srv_", rcv.extra)
			return append(out, srv[0], srv[1])
		})
	})
}
