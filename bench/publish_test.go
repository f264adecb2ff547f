// Publish benchmarks on a three-node cluster of real mqd processes, through
// the leader, 1 KiB payloads, each publisher waiting for its answer
// (committed and fsynced on a majority) before sending the next.
//
//	go test -run '^$' -bench 'Publish$' -benchtime 5000x ./bench/          # no key, 1/16/64 publishers
//	go test -run '^$' -bench 'PublishWithKey$' -benchtime 5000x ./bench/   # unique Idempotency-Key each
//	go test -run '^$' -bench PublishKeyVsNoKey ./bench/                    # 4 rounds x (2 s no key + 2 s key), 64 publishers
//	go test -run '^$' -bench PublishKeyVsNoKey ./bench/ -bench.rounds=8 -bench.round=3s
//	go test -run '^$' -bench PublishBatch -benchtime 50000x ./bench/      # messages:batch of 100, 8 publishers
//
// Publish, PublishWithKey and PublishBatch: b.N is the number of messages.
// They report msgs/s and the request latency p50/p99/p999 in ms.
// PublishKeyVsNoKey ignores b.N (see fixed) and reports both rates, their
// ratio key/nokey, and each side's latency percentiles.

package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// keyNonce makes every run's idempotency keys unique.
var keyNonce atomic.Uint64

func init() { keyNonce.Store(rand.Uint64() >> 8) }

// publishOp publishes body to topic, one message per operation, expecting
// 201; keyed adds an Idempotency-Key unique to this op and i.
func (s *system) publishOp(topic string, body []byte, keyed bool) func(int, int64) (int, error) {
	url := s.url(topic, "/messages")
	nonce := keyNonce.Add(1)
	return func(_ int, i int64) (int, error) {
		var hdr map[string]string
		if keyed {
			hdr = map[string]string{"Idempotency-Key": fmt.Sprintf("%016x-%020d", nonce, i)}
		}
		_, err := s.post(context.Background(), url, body, hdr, http.StatusCreated)
		return 1, err
	}
}

// BenchmarkPublish publishes 1 KiB messages without keys through the leader
// of a three-node cluster with 1, 16 and 64 concurrent publishers.
func BenchmarkPublish(b *testing.B) { benchPublishers(b, false) }

// BenchmarkPublishWithKey is BenchmarkPublish with a unique Idempotency-Key
// on every message: the leader looks each key up before proposing, and the
// FSM looks it up again and records it (key index and expiry index).
func BenchmarkPublishWithKey(b *testing.B) { benchPublishers(b, true) }

func benchPublishers(b *testing.B, keyed bool) {
	s := startSystem(b, 3)
	body := payload(payloadSize)
	for _, publishers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			topic := s.topic(b, fmt.Sprintf("pub-k%v-p%d", keyed, publishers), nil)
			op := s.publishOp(topic, body, keyed)
			b.ResetTimer()
			n, lat, elapsed, err := driver{workers: publishers, next: untilN(b.N)}.run(op)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			report(b, append([]metric{{float64(n) / elapsed.Seconds(), "msgs/s"}}, latencyMetrics("", lat)...))
		})
	}
}

// BenchmarkPublishKeyVsNoKey measures the cost of idempotency keys as the
// ratio of two throughputs taken side by side in one cluster: 64 publishers
// alternate between a topic without keys and one with a unique key per
// message, in -bench.rounds rounds of two -bench.round windows (the order
// flips every round, so a drift in the machine's load hits both sides
// alike). key/nokey is the figure to compare with "within 5 %"; the per
// round ratios are logged (-v) to show the noise.
func BenchmarkPublishKeyVsNoKey(b *testing.B) {
	s := startSystem(b, 3)
	body := payload(payloadSize)
	const publishers = 64
	b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
		fixed(b, func(b *testing.B) []metric {
			topics := [2]string{s.topic(b, "nokey", nil), s.topic(b, "key", nil)}
			window := func(side int, d time.Duration) (int64, []time.Duration, time.Duration) {
				op := s.publishOp(topics[side], body, side == 1)
				n, lat, el, err := driver{workers: publishers, next: until(time.Now().Add(d))}.run(op)
				if err != nil {
					b.Fatal(err)
				}
				return n, lat, el
			}
			// Warm up both sides: connections, the leader's caches, bbolt's first pages.
			window(0, time.Second)
			window(1, time.Second)
			var msgs [2]int64
			var secs [2]float64
			var lat [2][]time.Duration
			for r := range *flagRounds {
				var rate [2]float64
				for j := range 2 {
					side := (r + j) % 2
					n, l, el := window(side, *flagRound)
					msgs[side] += n
					secs[side] += el.Seconds()
					lat[side] = append(lat[side], l...)
					rate[side] = float64(n) / el.Seconds()
				}
				b.Logf("round %d: nokey %.0f msgs/s, key %.0f msgs/s, key/nokey %.3f", r+1, rate[0], rate[1], rate[1]/rate[0])
			}
			nokey, key := float64(msgs[0])/secs[0], float64(msgs[1])/secs[1]
			out := []metric{{nokey, "nokey_msgs/s"}, {key, "key_msgs/s"}, {key / nokey, "key/nokey"}}
			out = append(out, latencyMetrics("nokey_", lat[0])...)
			return append(out, latencyMetrics("key_", lat[1])...)
		})
	})
}

// BenchmarkPublishBatch publishes messages:batch requests of 100 messages of
// 1 KiB each from 8 concurrent publishers. b.N is the number of messages;
// the latency percentiles are per request (100 messages).
func BenchmarkPublishBatch(b *testing.B) {
	s := startSystem(b, 3)
	const publishers, batch = 8, 100
	val := string(payload(payloadSize))
	msgs := make([]batchMsg, batch)
	for i := range msgs {
		msgs[i] = batchMsg{Value: val}
	}
	full := batchBody(msgs)
	b.Run(fmt.Sprintf("publishers=%d/batch=%d", publishers, batch), func(b *testing.B) {
		topic := s.topic(b, "batch", nil)
		var next atomic.Int64
		d := driver{workers: publishers, next: func() (int64, bool) {
			i := next.Add(batch) - batch
			return i, i < int64(b.N)
		}}
		b.ResetTimer()
		n, lat, elapsed, err := d.run(func(_ int, i int64) (int, error) {
			k, body := batch, full
			if rest := b.N - int(i); rest < batch {
				k, body = rest, batchBody(msgs[:rest])
			}
			return k, s.publishBatch(context.Background(), topic, body, k)
		})
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		report(b, append([]metric{{float64(n) / elapsed.Seconds(), "msgs/s"}}, latencyMetrics("", lat)...))
	})
}
