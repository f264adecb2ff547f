// Scaling of durable publish with message size and node count: 64
// publishers through the leader, payloads of 100 B, 1 KiB and 64 KiB, on a
// single node and on a three-node cluster.
//
//	go test -run '^$' -bench PublishScaling -benchtime 3000x ./bench/
//
// b.N is the number of messages. Reports msgs/s, MiB/s of payload, and the
// request latency p50/p99/p999 in ms.

package bench

import (
	"fmt"
	"testing"
)

// BenchmarkPublishScaling publishes at 64 publishers for every combination
// of node count (1, 3) and payload size (100 B, 1 KiB, 64 KiB).
func BenchmarkPublishScaling(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			s := startSystem(b, nodes)
			for _, size := range []int{100, 1024, 64 << 10} {
				b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
					topic := s.topic(b, fmt.Sprintf("scale-n%d-s%d", nodes, size), nil)
					op := s.publishOp(topic, payload(size), false)
					b.ResetTimer()
					n, lat, elapsed, err := driver{workers: 64, next: untilN(b.N)}.run(op)
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					rate := float64(n) / elapsed.Seconds()
					report(b, append([]metric{{rate, "msgs/s"}, {rate * float64(size) / (1 << 20), "MiB/s"}},
						latencyMetrics("", lat)...))
				})
			}
		})
	}
}
