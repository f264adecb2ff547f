// The cost of exactly-once processing: one input and one output per step,
// as one process call against a publish and an ack, on a three-node
// cluster through the leader, 1 KiB payloads.
//
//	go test -run '^$' -bench ProcessVsPublishAck -benchtime 2000x ./bench/
//
// b.N is the number of input messages (a backlog published outside the
// timer). 4 workers each fetch one message, then either process it (ack +
// one keyed output in one call) or publish the output (keyed) and ack the
// input (two calls). Reports msgs/s, the cluster's and the leader's CPU
// per message (cpu_us/msg, leader_cpu_us/msg), messages per CPU-second of
// the whole cluster (msgs/cpu_s), and the latency of a fetch and its step
// (p50/p99/p999).

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

func BenchmarkProcessVsPublishAck(b *testing.B) {
	s := startSystem(b, 3)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ci, err := s.leader.Cluster(context.Background()); err == nil && ci.StateFormat >= 3 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("state format 3 not reached within 30s")
		}
	}
	out := string(payload(payloadSize))
	steps := map[string]func(ctx context.Context, in, outTopic string, m tc.Message) error{
		"process": func(ctx context.Context, in, outTopic string, m tc.Message) error {
			body, _ := json.Marshal(map[string]any{"ack": []string{m.Receipt}, "publish": []map[string]any{
				{"topic": outTopic, "value": out, "idempotency_key": fmt.Sprintf("out-%d-%d", m.Partition, m.Offset)}}})
			_, err := s.post(ctx, s.url(in, "/groups/g/process"), body, nil, http.StatusOK)
			return err
		},
		"publish+ack": func(ctx context.Context, in, outTopic string, m tc.Message) error {
			hdr := map[string]string{"Idempotency-Key": fmt.Sprintf("out-%d-%d", m.Partition, m.Offset)}
			if _, err := s.post(ctx, s.url(outTopic, "/messages"), []byte(out), hdr, http.StatusCreated); err != nil {
				return err
			}
			res, _, err := s.leader.Ack(ctx, in, "g", []string{m.Receipt})
			if err == nil && (len(res) != 1 || res[0].Status != "ok") {
				err = fmt.Errorf("ack: %+v", res)
			}
			return err
		},
	}
	for _, name := range []string{"process", "publish+ack"} {
		step := steps[name]
		b.Run(name, func(b *testing.B) {
			b.StopTimer()
			in, outTopic := s.topic(b, "pin", nil), s.topic(b, "pout", nil)
			s.putGroup(b, in, "g")
			s.backlog(b, in, b.N, payloadSize)
			ctx := context.Background()
			var done atomic.Int64
			d := driver{workers: 4, next: func() (int64, bool) {
				i := done.Load()
				return i, i < int64(b.N)
			}}
			b.StartTimer()
			cpuStart := s.cpu()
			n, lat, elapsed, err := d.run(func(_ int, _ int64) (int, error) {
				msgs, _, err := s.leader.Fetch(ctx, in, "g", tc.FetchRequest{Max: 1, WaitMs: 200})
				if err != nil || len(msgs) == 0 {
					return 0, err
				}
				if err := step(ctx, in, outTopic, msgs[0]); err != nil {
					return 0, err
				}
				done.Add(1)
				return 1, nil
			})
			cpuEnd := s.cpu()
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			ms := append([]metric{{float64(n) / elapsed.Seconds(), "msgs/s"}}, cpuMetrics(cpuStart, cpuEnd, int(n))...)
			if cpuEnd.ok && cpuStart.ok && cpuEnd.cluster > cpuStart.cluster {
				ms = append(ms, metric{float64(n) / (cpuEnd.cluster - cpuStart.cluster).Seconds(), "msgs/cpu_s"})
			}
			report(b, append(ms, latencyMetrics("", lat)...))
		})
	}
}

// BenchmarkReconcile10k: a reconcile of 10,000 keys (9,000 stored, 1,000
// missing; one group, half acked) through the leader of a three-node
// cluster, JSON both ways included. b.N is the number of reconcile calls;
// reports the latency of one (ms/call) and its p50/p99.
//
//	go test -run '^$' -bench Reconcile10k -benchtime 20x ./bench/
func BenchmarkReconcile10k(b *testing.B) {
	s := startSystem(b, 3)
	topic := s.topic(b, "rec", map[string]any{"partitions": 4})
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%06d", i)
	}
	for i := 0; i < 9000; i += 1000 {
		msgs := make([]batchMsg, 1000)
		for j := range msgs {
			msgs[j] = batchMsg{Value: "payload", IdempotencyKey: keys[i+j]}
		}
		if err := s.publishBatch(context.Background(), topic, batchBody(msgs), len(msgs)); err != nil {
			b.Fatal(err)
		}
	}
	for acked := 0; acked < 4500; {
		msgs, _, err := s.leader.Fetch(context.Background(), topic, "g", tc.FetchRequest{Max: 500, WaitMs: 1000})
		if err != nil {
			b.Fatal(err)
		}
		rs := make([]string, len(msgs))
		for i, m := range msgs {
			rs[i] = m.Receipt
		}
		if _, _, err := s.leader.Ack(context.Background(), topic, "g", rs); err != nil {
			b.Fatal(err)
		}
		acked += len(msgs)
	}
	body, _ := json.Marshal(map[string]any{"keys": keys})
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		r, err := s.post(context.Background(), s.url(topic, "/reconcile"), body, nil, http.StatusOK)
		if err != nil {
			b.Fatal(err)
		}
		var rec struct {
			Missing []string `json:"missing"`
			Stored  int      `json:"stored"`
		}
		if err := r.JSON(&rec); err != nil || len(rec.Missing) != 1000 || rec.Stored != 9000 {
			b.Fatalf("reconcile: %d missing, %d stored, %v", len(rec.Missing), rec.Stored, err)
		}
		lat = append(lat, r.Elapsed)
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	report(b, append([]metric{{ms(sum) / float64(len(lat)), "ms/call"}}, latencyMetrics("", lat)[:2]...))
}
