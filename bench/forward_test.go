// CPU per published message on each node of a three-node cluster, with the
// publishes sent to the leader or to a follower (which forwards them).
//
//	go test -run '^$' -bench PublishCPU -benchtime 20000x ./bench/
//
// b.N is the number of messages (1 KiB, a unique Idempotency-Key each, 64
// publishers). Each node's CPU (user + system, /proc/PID/stat, 10 ms ticks)
// over the timed part is divided by the messages: leader_us/msg (the leader
// of the topic's raft group: with --data-groups, that data group's),
// entry_us/msg (follower 1: the node the publishes go to when
// via=follower), other_us/msg (follower 2), and cluster_us/msg, their sum; leader_B/msg and entry_B/msg
// are the bytes the leader and follower 1 allocated per message
// (go_memstats_alloc_bytes_total from /metrics); cmds/append is the leader's
// commands per group commit (mqd_batch_commands sum over count), append_ms
// the mean time of one in raft (mqd_batch_raft_seconds), queue_ms a
// command's mean wait for its entry to close (mqd_batch_queue_seconds), and
// cmds/fwd the entry follower's commands per coalesced forward (0: none).

package bench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

func BenchmarkPublishCPU(b *testing.B) {
	s := startSystem(b, 3)
	body := payload(payloadSize)
	const publishers = 64
	for _, via := range []string{"leader", "follower"} {
		b.Run(fmt.Sprintf("via=%s/publishers=%d", via, publishers), func(b *testing.B) {
			topic := s.topic(b, "cpu-"+via, nil)
			nodes := s.topicRoles(b, topic)
			entry := nodes[0]
			if via == "follower" {
				entry = nodes[1]
			}
			url := entry.URL() + "/v1/topics/" + topic + "/messages"
			nonce := keyNonce.Add(1)
			op := func(_ int, i int64) (int, error) {
				hdr := map[string]string{"Idempotency-Key": fmt.Sprintf("%016x-%020d", nonce, i)}
				_, err := s.post(context.Background(), url, body, hdr, http.StatusCreated)
				return 1, err
			}
			before, allocBefore := nodesCPU(b, nodes), nodesAllocated(b, nodes)
			batchBefore, fwdBefore := nodeMetrics(b, nodes[0], batchSeries...), nodeMetrics(b, nodes[1], coalescedSeries...)
			prof := profileNodes(b, map[string]*tc.Node{"leader": nodes[0], "entry": nodes[1], "other": nodes[2]})
			b.ResetTimer()
			n, lat, elapsed, err := driver{workers: publishers, next: untilN(b.N)}.run(op)
			b.StopTimer()
			after, allocAfter := nodesCPU(b, nodes), nodesAllocated(b, nodes)
			batchAfter, fwdAfter := nodeMetrics(b, nodes[0], batchSeries...), nodeMetrics(b, nodes[1], coalescedSeries...)
			prof()
			if err != nil {
				b.Fatal(err)
			}
			per := func(i int) float64 { return float64(after[i]-before[i]) / float64(time.Microsecond) / float64(n) }
			ms := []metric{{float64(n) / elapsed.Seconds(), "msgs/s"},
				{per(0), "leader_us/msg"}, {per(1), "entry_us/msg"}, {per(2), "other_us/msg"},
				{per(0) + per(1) + per(2), "cluster_us/msg"},
				{(allocAfter[0] - allocBefore[0]) / float64(n), "leader_B/msg"},
				{(allocAfter[1] - allocBefore[1]) / float64(n), "entry_B/msg"},
				{ratio(batchAfter[0]-batchBefore[0], batchAfter[1]-batchBefore[1]), "cmds/append"},
				{1000 * ratio(batchAfter[2]-batchBefore[2], batchAfter[1]-batchBefore[1]), "append_ms"},
				{1000 * ratio(batchAfter[3]-batchBefore[3], batchAfter[0]-batchBefore[0]), "queue_ms"},
				{ratio(fwdAfter[0]-fwdBefore[0], fwdAfter[1]-fwdBefore[1]), "cmds/fwd"}}
			report(b, append(ms, latencyMetrics("", lat)...))
		})
	}
}

// batchSeries are the leader's group commit figures: commands proposed and
// raft appends (every raft group's); coalescedSeries the entry follower's
// coalesced forwards: commands sent and internal requests (none: 0).
var (
	batchSeries = []string{"mqd_batch_commands_sum", "mqd_batch_commands_count",
		"mqd_batch_raft_seconds_sum", "mqd_batch_queue_seconds_sum"}
	coalescedSeries = []string{"?mqd_forward_coalesced_commands_total", "?mqd_forward_coalesced_requests_total"}
)

// ratio is a/b, 0 when b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// topicRoles are the leader of topic's raft group, then the two other
// nodes: the metadata leader and its followers for a topic of the default
// group; for a topic placed in a data group (--data-groups), whose leader
// may be another node, that group's leader once it is the group's
// preferred one (its first replica), to which the group is handed soon
// after its creation.
func (s *system) topicRoles(b *testing.B, topic string) []*tc.Node {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		var got struct {
			Placement struct {
				Group, Leader string
				Replicas      []string
			}
		}
		r, err := s.leader.Do(ctx, http.MethodGet, "/v1/topics/"+topic, nil, nil)
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err == nil {
			err = r.JSON(&got)
		}
		p := got.Placement
		switch {
		case err == nil && p.Group == "":
			fs, err := s.c.Followers(ctx)
			if err != nil || len(fs) != 2 {
				b.Fatalf("followers: %v %v", fs, err)
			}
			return []*tc.Node{s.leader, fs[0], fs[1]}
		case err == nil && p.Leader != "" && len(p.Replicas) == 3 && p.Leader == p.Replicas[0]:
			out := []*tc.Node{s.c.NodeByID(p.Leader)}
			for _, n := range s.c.Nodes() {
				if n.ID() != p.Leader {
					out = append(out, n)
				}
			}
			return out
		}
		if ctx.Err() != nil {
			b.Fatalf("topic %s: placement %+v (%v), want a group led by its first replica", topic, p, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var flagProfile = flag.String("bench.cpuprofile", "",
	"PublishCPU, ConsumeAck: write CPU and allocation profiles of each node (the first 5 s of the timed part) to this directory")

// profileNodes starts a 5 s CPU and allocation profile of each node (GET
// /debug/pprof/profile and /debug/pprof/allocs?seconds=5) when
// -bench.cpuprofile is set; the function it returns waits for them, which
// are in DIR/<benchmark>-<role>.{cpu,allocs}.pprof.
func profileNodes(b *testing.B, nodes map[string]*tc.Node) func() {
	if *flagProfile == "" {
		return func() {}
	}
	var wg sync.WaitGroup
	for role, n := range nodes {
		for kind, path := range map[string]string{"cpu": "profile", "allocs": "allocs"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				r, err := n.Do(ctx, http.MethodGet, "/debug/pprof/"+path+"?seconds=5", nil, nil)
				if err == nil {
					err = r.Expect(http.StatusOK)
				}
				if err == nil {
					name := strings.NewReplacer("/", "_", "=", "-").Replace(b.Name()) + "-" + role + "." + kind + ".pprof"
					err = os.WriteFile(filepath.Join(*flagProfile, name), r.Body, 0o644)
				}
				if err != nil {
					b.Errorf("%s profile of %s: %v", kind, n, err)
				}
			}()
		}
	}
	return wg.Wait
}

// nodesAllocated reads each node's go_memstats_alloc_bytes_total (bytes
// allocated on its Go heap so far) from GET /metrics.
func nodesAllocated(b *testing.B, nodes []*tc.Node) []float64 {
	b.Helper()
	out := make([]float64, len(nodes))
	for i, n := range nodes {
		out[i] = nodeMetrics(b, n, "go_memstats_alloc_bytes_total")[0]
	}
	return out
}

// nodeMetrics reads the sums, over every label set, of the named series
// from n's GET /metrics, in the order of names; a name with no series
// ends the benchmark unless it is marked optional by a leading '?' (then 0).
func nodeMetrics(b *testing.B, n *tc.Node, names ...string) []float64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	r, err := n.Do(ctx, http.MethodGet, "/metrics", nil, nil)
	cancel()
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		b.Fatalf("%s: %v", n, err)
	}
	out := make([]float64, len(names))
	for i, name := range names {
		name, optional := strings.CutPrefix(name, "?")
		found := false
		for _, line := range strings.Split(string(r.Body), "\n") {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || (rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			v := rest[strings.LastIndexByte(rest, ' ')+1:]
			x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatalf("%s: %q: %v", n, line, err)
			}
			out[i] += x
			found = true
		}
		if !found && !optional {
			b.Fatalf("%s: no %s in /metrics", n, name)
		}
	}
	return out
}

// nodesCPU reads each node's CPU time so far (user + system).
func nodesCPU(b *testing.B, nodes []*tc.Node) []time.Duration {
	b.Helper()
	out := make([]time.Duration, len(nodes))
	for i, n := range nodes {
		d, err := procCPU(n.PID())
		if err != nil {
			b.Fatalf("%s: %v", n, err)
		}
		out[i] = d
	}
	return out
}
