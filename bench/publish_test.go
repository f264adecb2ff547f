// Package bench holds benchmarks of the whole system: a three-node cluster of
// real mqd processes driven over HTTP.
//
//	go test -run '^$' -bench . ./bench/
//	go test -run '^$' -bench Publish -benchtime 5000x -count 5 ./bench/ | tee new.txt   # then benchstat old.txt new.txt
//
// Each benchmark reports msgs/s and publish latency percentiles (p50_ms, p99_ms).
package bench

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { tc.Main(m) }

// BenchmarkPublish publishes 1 KiB messages through the leader of a
// three-node cluster with 1, 16 and 64 concurrent publishers, each waiting
// for its 201 (committed and fsynced on a majority) before the next.
func BenchmarkPublish(b *testing.B) {
	client := tc.NewClient(30*time.Second, 128)
	c := tc.Start(b, 3, tc.WithClient(client))
	leader, err := c.Leader(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("publishing through leader %s", leader)
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for _, publishers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			topic := fmt.Sprintf("bench-p%d", publishers)
			if _, err := leader.PutTopic(context.Background(), topic, nil); err != nil {
				b.Fatal(err)
			}
			benchPublish(b, leader, topic, payload, publishers)
		})
	}
}

func benchPublish(b *testing.B, leader *tc.Node, topic string, payload []byte, publishers int) {
	url := leader.URL() + "/v1/topics/" + topic + "/messages"
	client := leader.Client()
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	lat := make([][]time.Duration, publishers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				r, err := client.Do(context.Background(), http.MethodPost, url, payload, nil)
				d := time.Since(t0)
				if err == nil && r.Status != http.StatusCreated {
					err = r.Expect(http.StatusCreated)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				lat[p] = append(lat[p], d)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d publishes failed; first: %v", n, b.N, firstErr.Load())
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(ms(percentile(all, 0.50)), "p50_ms")
	b.ReportMetric(ms(percentile(all, 0.99)), "p99_ms")
	b.ReportMetric(0, "ns/op")
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
