package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var flagSnapBytesFor = flag.Duration("snapbytes.duration", 60*time.Second,
	"SnapshotBytes: how long each load runs")

// BenchmarkSnapshotBytes measures the snapshot policy's cost under steady
// load: the bytes of snapshots the three nodes write against the bytes of
// raft log they apply (mqd_raft_snapshot_written_bytes_total over
// mqd_raft_applied_bytes_total, summed over the nodes), while the state
// grows. The nodes check the policy every second (--snapshot-interval 1s;
// the default 30 s only samples the same rule less often).
//
// load=batch publishes 1 KiB messages in batches of 1000 (the state grows
// fast, snapshots wait for log bytes); load=small publishes 100-byte
// messages one per request from 16 publishers (entries are small, so a
// small state snapshots by entry count).
//
//	go test -run '^$' -bench SnapshotBytes -benchtime 1x ./bench/ -snapbytes.duration 60s
func BenchmarkSnapshotBytes(b *testing.B) {
	for _, load := range []string{"batch", "small"} {
		b.Run("load="+load, func(b *testing.B) {
			fixed(b, func(b *testing.B) []metric { return snapshotBytes(b, load) })
		})
	}
}

func snapshotBytes(b *testing.B, load string) []metric {
	s := startSystem(b, 3, "--snapshot-interval", "1s")
	topic := s.topic(b, "snapbytes", map[string]any{"partitions": 4})
	ctx, cancel := context.WithTimeout(context.Background(), *flagSnapBytesFor+2*time.Minute)
	defer cancel()
	before := clusterCounters(ctx, b, s.c)
	d := driver{workers: 16, next: until(time.Now().Add(*flagSnapBytesFor))}
	op := func(_ int, _ int64) (int, error) {
		_, err := s.post(ctx, s.url(topic, "/messages"), payload(100), nil, http.StatusCreated)
		return 1, err
	}
	if load == "batch" {
		full := make([]batchMsg, 1000)
		for i := range full {
			full[i] = batchMsg{Value: string(payload(payloadSize))}
		}
		body := batchBody(full)
		d.workers = 4
		op = func(_ int, _ int64) (int, error) { return 1000, s.publishBatch(ctx, topic, body, 1000) }
	}
	msgs, _, elapsed, err := d.run(op)
	if err != nil {
		b.Fatal(err)
	}
	after := clusterCounters(ctx, b, s.c)
	snap := after["mqd_raft_snapshot_written_bytes_total"] - before["mqd_raft_snapshot_written_bytes_total"]
	logged := after["mqd_raft_applied_bytes_total"] - before["mqd_raft_applied_bytes_total"]
	taken := after["mqd_raft_snapshots_total"] - before["mqd_raft_snapshots_total"]
	b.Logf("%d messages in %v; the nodes applied %.1f MiB of log and wrote %.0f snapshots, %.1f MiB",
		msgs, elapsed.Round(time.Millisecond), logged/(1<<20), taken, snap/(1<<20))
	return []metric{
		{snap / logged, "snapshot_bytes_per_log_byte"},
		{taken / 3, "snapshots_per_node"},
		{logged / 3 / (1 << 20) / elapsed.Hours(), "log_MiB_per_node_hour"},
		{snap / 3 / (1 << 20) / elapsed.Hours(), "snapshot_MiB_per_node_hour"},
	}
}

// clusterCounters sums the snapshot and log counters of every node's
// /metrics.
func clusterCounters(ctx context.Context, b *testing.B, c *tc.Cluster) map[string]float64 {
	b.Helper()
	out := map[string]float64{}
	for _, n := range c.Nodes() {
		r, err := n.Do(ctx, http.MethodGet, "/metrics", nil, nil)
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err != nil {
			b.Fatalf("%s /metrics: %v", n, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.Body))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			name, val, ok := strings.Cut(sc.Text(), " ")
			name, _, _ = strings.Cut(name, "{") // summed over the raft_group label's values
			switch name {
			case "mqd_raft_snapshot_written_bytes_total", "mqd_raft_applied_bytes_total", "mqd_raft_snapshots_total":
			default:
				continue
			}
			v, err := strconv.ParseFloat(val, 64)
			if !ok || err != nil {
				b.Fatalf("%s /metrics: bad line %q", n, sc.Text())
			}
			out[name] += v
		}
	}
	for _, k := range []string{"mqd_raft_snapshot_written_bytes_total", "mqd_raft_applied_bytes_total", "mqd_raft_snapshots_total"} {
		if _, ok := out[k]; !ok {
			b.Fatalf("/metrics has no %s", k)
		}
	}
	return out
}
