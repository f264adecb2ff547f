// The spread workload at a fixed offered rate: the same three topics, 48
// publishers and entry nodes as BenchmarkSpread (spread_test.go), but the
// publishers together offer -spread.rate messages per second (default
// 1000) for -spread.duration (default 20 s), on 3 and 5 nodes, with the
// topics in the default group (groups=single) and in data groups
// (groups=data).
//
//	go test -run '^$' -bench SpreadRate -benchtime 1x ./bench/ [-spread.rate=1000 -spread.duration=20s]
//
// BenchmarkSpread saturates the machine, so on its shared cores more nodes
// means fewer messages per commit and more CPU per message; here every
// cluster gets the same work, and what is compared is what it costs each
// node. Message i is due at start + i/rate and sent by publisher i%48 (each
// publisher has one request in flight, and sleeps until its next message's
// due time, an absolute time, so lateness does not add up); a publisher
// that falls behind sends at once until it catches up. After a warm-up of
// the same pace (spreadWarmup), the timed part sends rate × duration
// messages; a publisher still sending 1.5 × duration after the start stops,
// and each request has 10 s.
//
// Reported, over the timed part (from the CPU sample before the first
// message to the one after the last answer): offered_msgs/s and msgs/s
// (achieved: messages answered ÷ wall seconds) and their ratio,
// achieved/offered (the case fails below minAchieved); each node's CPU
// (user + system, /proc/PID/stat) in cores (CPU-seconds ÷ wall seconds,
// nodeK_cores) and per message (nodeK_us/msg); busiest_cores, mean_cores
// and cluster_cores (their largest, mean and sum), cluster_us/msg,
// busiest_share, leaders; commits/s and cmds/commit, the group commits of
// all groups (raft appends, each fsynced on every replica of its group)
// and the commands each carried (mqd_batch_commands on /metrics);
// lag_p99_ms and lag_max_ms, how late the publishers sent after their
// messages' due times; bench_cores, this process's CPU (the publishers
// share the machine with the nodes); load1, the machine's 1-minute load
// average at the end; publish latency p50/p99/p999.

package bench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var (
	flagSpreadRate = flag.Int("spread.rate", 1000, "SpreadRate: messages per second offered by all the publishers together")
	flagSpreadDur  = flag.Duration("spread.duration", 20*time.Second, "SpreadRate: length of the timed part")
)

const (
	// spreadWarmup is the paced, untimed publishing before the timed part:
	// connections opened, groups' leaders settled, caches warm.
	spreadWarmup = 3 * time.Second
	// minAchieved is the least achieved/offered ratio a case passes with.
	minAchieved = 0.97
)

func BenchmarkSpreadRate(b *testing.B) {
	const ntopics = 3
	for _, mode := range []string{"single", "data"} {
		for _, nodes := range []int{3, 5} {
			name := fmt.Sprintf("groups=%s/nodes=%d/topics=%d/rate=%d", mode, nodes, ntopics, *flagSpreadRate)
			b.Run(name, func(b *testing.B) {
				fixed(b, func(b *testing.B) []metric { return spreadRate(b, mode, nodes, ntopics) })
			})
		}
	}
}

// spreadRate is one BenchmarkSpreadRate case.
func spreadRate(b *testing.B, mode string, nodes, ntopics int) []metric {
	rate, dur := float64(*flagSpreadRate), *flagSpreadDur
	if rate <= 0 || dur <= 0 {
		b.Fatalf("-spread.rate %v, -spread.duration %v: both must be positive", rate, dur)
	}
	sc := startSpread(b, mode, nodes, ntopics)
	body := payload(payloadSize)
	send := func(ctx context.Context, w int) error {
		_, err := sc.s.post(ctx, sc.urls[w], body, nil, http.StatusCreated)
		return err
	}
	if r := pace(rate, int(rate*spreadWarmup.Seconds()), send); r.err != nil {
		b.Fatalf("warm-up: %v", r.err)
	}
	self := os.Getpid()
	benchBefore, err := procCPU(self)
	if err != nil {
		b.Fatal(err)
	}
	cmdsBefore, commitsBefore := groupCommits(b, sc.nodes)
	before, t0 := nodesCPU(b, sc.nodes), time.Now()
	r := pace(rate, int(rate*dur.Seconds()), send)
	after, wall := nodesCPU(b, sc.nodes), time.Since(t0)
	cmdsAfter, commitsAfter := groupCommits(b, sc.nodes)
	benchAfter, err := procCPU(self)
	if err != nil {
		b.Fatal(err)
	}
	if r.err != nil {
		b.Fatal(r.err)
	}
	if r.sent == 0 {
		b.Fatal("no message sent")
	}
	achieved := float64(r.sent) / wall.Seconds()
	out := []metric{{rate, "offered_msgs/s"}, {achieved, "msgs/s"}, {achieved / rate, "achieved/offered"}}
	cores := make([]float64, len(sc.nodes))
	var cluster float64
	for i := range sc.nodes {
		cpu := after[i] - before[i]
		cores[i] = cpu.Seconds() / wall.Seconds()
		cluster += cores[i]
		out = append(out, metric{cores[i], fmt.Sprintf("node%d_cores", i+1)},
			metric{float64(cpu) / float64(time.Microsecond) / float64(r.sent), fmt.Sprintf("node%d_us/msg", i+1)})
	}
	busiest := slices.Max(cores)
	out = append(out, metric{busiest, "busiest_cores"}, metric{cluster / float64(len(cores)), "mean_cores"},
		metric{cluster, "cluster_cores"}, metric{cluster * 1e6 / achieved, "cluster_us/msg"},
		metric{busiest / cluster, "busiest_share"}, metric{float64(sc.leaders), "leaders"})
	if commits := commitsAfter - commitsBefore; commits > 0 {
		out = append(out, metric{commits / wall.Seconds(), "commits/s"}, metric{(cmdsAfter - cmdsBefore) / commits, "cmds/commit"})
	}
	lag := latencyMetrics("lag_", r.lag)
	out = append(out, lag[1], metric{ms(slices.Max(r.lag)), "lag_max_ms"},
		metric{(benchAfter - benchBefore).Seconds() / wall.Seconds(), "bench_cores"}, metric{loadAverage(b), "load1"})
	out = append(out, latencyMetrics("", r.lat)...)
	if achieved < minAchieved*rate {
		var figs []string
		for _, m := range out {
			figs = append(figs, fmt.Sprintf("%.4g %s", m.v, m.unit))
		}
		b.Errorf("offered %.0f msgs/s, achieved %.0f (%.3f; %d messages in %v): the cluster did not keep up (%s)",
			rate, achieved, achieved/rate, r.sent, wall.Round(time.Millisecond), strings.Join(figs, ", "))
	}
	return out
}

// paced is what pace did: the messages answered, each one's lateness
// (sent − due) and publish latency, and the first error.
type paced struct {
	sent     int
	lag, lat []time.Duration
	err      error
}

// pace sends total messages with send, message i due at start + i/rate and
// sent by publisher i % spreadPublishers, one request in flight per
// publisher. A publisher sleeps until its next message's due time (an
// absolute time, so oversleeping delays one message, not the ones after) or
// sends at once when it is late. Bounded: a publisher stops, with an error,
// once it is 1.5 × the schedule's length past the start, and each send
// has 10 s.
func pace(rate float64, total int, send func(ctx context.Context, w int) error) paced {
	interval := float64(time.Second) / rate
	start := time.Now()
	stop := start.Add(time.Duration(1.5 * float64(total) * interval))
	var (
		sent     atomic.Int64
		mu       sync.Mutex
		wg       sync.WaitGroup
		out      paced
		failures []string
	)
	for w := range spreadPublishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lag, lat []time.Duration
			var err error
			for i := w; i < total && err == nil; i += spreadPublishers {
				due := start.Add(time.Duration(float64(i) * interval))
				time.Sleep(time.Until(due))
				t := time.Now()
				if t.After(stop) {
					err = fmt.Errorf("publisher %d: message %d not sent by %v after the start", w, i, stop.Sub(start).Round(time.Millisecond))
					break
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = send(ctx, w)
				cancel()
				if err == nil {
					lag, lat = append(lag, t.Sub(due)), append(lat, time.Since(t))
					sent.Add(1)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			out.lag, out.lat = append(out.lag, lag...), append(out.lat, lat...)
			if err != nil {
				failures = append(failures, err.Error())
			}
		}()
	}
	wg.Wait()
	out.sent = int(sent.Load())
	if len(failures) > 0 {
		out.err = fmt.Errorf("%d of %d publishers failed; first: %s", len(failures), spreadPublishers, failures[0])
	}
	return out
}

// groupCommits sums, over nodes and their raft groups, the commands their
// leaders' group commits carried and the commits (raft appends) they made
// so far: mqd_batch_commands_sum and _count on GET /metrics.
func groupCommits(b *testing.B, nodes []*tc.Node) (cmds, commits float64) {
	b.Helper()
	for _, n := range nodes {
		v := nodeMetrics(b, n, "?mqd_batch_commands_sum", "?mqd_batch_commands_count") // forward_test.go
		cmds += v[0]
		commits += v[1]
	}
	return cmds, commits
}

// loadAverage is the machine's 1-minute load average (/proc/loadavg).
func loadAverage(b *testing.B) float64 {
	b.Helper()
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		b.Fatalf("/proc/loadavg: %q", raw)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		b.Fatalf("/proc/loadavg: %v", err)
	}
	return v
}
