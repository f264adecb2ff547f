// Work spread over a cluster: three topics, publishers spread evenly over
// them and over the nodes they publish through, on 3 and 5 nodes, with the
// topics in the one default raft group (groups=single, as before data
// groups) and in data groups (groups=data: --data-groups, one group per
// topic here, each led by another node).
//
//	go test -run '^$' -bench Spread -benchtime 20000x ./bench/
//
// b.N is the number of messages (1 KiB, 48 publishers, publisher i writes
// topic i%3 through node (i/3)%N, so every node is an entry point of every
// topic). Each node's
// CPU (user + system, /proc/PID/stat) over the timed part, per message:
// nodeK_us/msg; cluster_us/msg is their sum, busiest_share the largest
// node's part of it, and leaders the number of distinct nodes leading the
// three topics (placement.leader in GET /v1/topics/{topic}, or the
// cluster's leader while topics have no placement of their own).
//
// model_msgs/s is the throughput a cluster of N separate machines would
// reach, each with this machine's cores to itself: the busiest node
// saturates first, so it is cores × 1 s ÷ busiest_us/msg. The model assumes
// CPU is the bound (not the disk's fsync rate nor the network) and that a
// node's CPU per message does not change with load; on this shared 2-core
// machine all nodes compete for the same cores, so msgs/s itself cannot grow
// with nodes: the busiest share is what shows the spread.

package bench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"
)

func BenchmarkSpread(b *testing.B) {
	for _, mode := range []string{"single", "data"} {
		for _, nodes := range []int{3, 5} {
			b.Run(fmt.Sprintf("groups=%s/nodes=%d/topics=%d", mode, nodes, *flagSpreadTopics), func(b *testing.B) {
				spread(b, mode, nodes, *flagSpreadTopics)
			})
		}
	}
}

// flagSpreadTopics is BenchmarkSpread's number of topics (3, the issue's
// workload; as many as nodes shows every node leading one).
var flagSpreadTopics = flag.Int("spread.topics", 3, "Spread: topics the publishers spread over")

// spread is one BenchmarkSpread case: mode "single" keeps every topic in
// the default group (one raft group, as before data groups), "data" starts
// the nodes with --data-groups and waits until the topics' groups are led
// by as many nodes as there are topics (or nodes, when fewer).
func spread(b *testing.B, mode string, nodes, ntopics int) {
	var flags []string
	if mode == "data" {
		flags = append(flags, "--data-groups")
	}
	s := startSystem(b, nodes, flags...)
	all := s.c.Nodes()
	topics := make([]string, ntopics)
	for i := range topics {
		topics[i] = s.topic(b, fmt.Sprintf("spread-%d", i), nil)
	}
	leaders := topicLeaders(b, s, topics)
	for wait := time.Now().Add(30 * time.Second); mode == "data" && leaders < min(len(topics), nodes) && time.Now().Before(wait); {
		time.Sleep(100 * time.Millisecond) // each group moves to its preferred leader within a few seconds
		leaders = topicLeaders(b, s, topics)
	}
	body := payload(payloadSize)
	const publishers = 48
	urls := make([]string, publishers)
	for w := range urls {
		// Publisher w writes topic w%3 through node (w/3)%N: each topic is
		// entered through every node alike, as clients that do not know
		// its leader would. (Through node w%N, on three nodes each topic
		// had one entry node, its leader or not by the luck of placement.)
		entry := all[(w/len(topics))%len(all)]
		urls[w] = entry.URL() + "/v1/topics/" + topics[w%len(topics)] + "/messages"
	}
	op := func(w int, _ int64) (int, error) {
		_, err := s.post(context.Background(), urls[w], body, nil, http.StatusCreated)
		return 1, err
	}
	before := nodesCPU(b, all)
	b.ResetTimer()
	n, lat, elapsed, err := driver{workers: publishers, next: untilN(b.N)}.run(op)
	b.StopTimer()
	after := nodesCPU(b, all)
	if err != nil {
		b.Fatal(err)
	}
	ms := []metric{{float64(n) / elapsed.Seconds(), "msgs/s"}}
	per := make([]float64, len(all))
	var total float64
	for i := range all {
		per[i] = float64(after[i]-before[i]) / float64(time.Microsecond) / float64(n)
		total += per[i]
		ms = append(ms, metric{per[i], fmt.Sprintf("node%d_us/msg", i+1)})
	}
	busiest := slices.Max(per)
	ms = append(ms, metric{total, "cluster_us/msg"}, metric{busiest / total, "busiest_share"},
		metric{float64(leaders), "leaders"},
		metric{float64(runtime.NumCPU()) * float64(time.Second/time.Microsecond) / busiest, "model_msgs/s"})
	report(b, append(ms, latencyMetrics("", lat)...))
}

// topicLeaders counts the distinct nodes leading topics.
func topicLeaders(b *testing.B, s *system, topics []string) int {
	b.Helper()
	seen := map[string]bool{}
	for _, t := range topics {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := s.leader.Do(ctx, http.MethodGet, "/v1/topics/"+t, nil, nil)
		cancel()
		var ans struct {
			Placement *struct {
				Leader string `json:"leader"`
			} `json:"placement"`
		}
		if err == nil {
			err = r.Expect(http.StatusOK)
		}
		if err == nil {
			err = r.JSON(&ans)
		}
		if err != nil {
			b.Fatalf("topic %s: %v", t, err)
		}
		if ans.Placement != nil && ans.Placement.Leader != "" {
			seen[ans.Placement.Leader] = true
		} else {
			seen[s.leader.ID()] = true
		}
	}
	return len(seen)
}
