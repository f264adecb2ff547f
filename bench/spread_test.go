// Work spread over a cluster: three topics, publishers spread evenly over
// them and over the nodes they publish through, on 3 and 5 nodes, with the
// topics in the one default raft group (groups=single: --data-groups=false,
// as before data groups) and in data groups (groups=data:
// --data-groups=true, one group per topic here, each led by another node).
// Both pass the flag, whatever the binary's default, and check that the
// topics' placement is what the mode means.
//
//	go test -run '^$' -bench 'Spread$' -benchtime 20000x ./bench/
//
// ('Spread$': -bench Spread also runs BenchmarkSpreadRate, the same
// workload at a fixed offered rate, in spreadrate_test.go.)
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
	"errors"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
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

// spreadCluster is a cluster set up for the spread workload: its nodes,
// each publisher's publish URL and how many nodes lead the topics.
type spreadCluster struct {
	s       *system
	nodes   []*tc.Node
	urls    []string
	leaders int
}

// spreadPublishers is the spread workload's number of publishers.
const spreadPublishers = 48

// startSpread starts a cluster of nodes for the spread workload: mode
// "single" runs every node with --data-groups=false, so every topic is in
// the default group (one raft group, as before data groups); "data" runs
// them with --data-groups=true and waits until the topics' groups are led
// by as many nodes as there are topics (or nodes, when fewer). Either way
// it checks each topic's placement against the mode (checkPlacement).
func startSpread(b *testing.B, mode string, nodes, ntopics int) spreadCluster {
	b.Helper()
	var groups string
	switch mode {
	case "single":
		groups = "--data-groups=false"
	case "data":
		groups = "--data-groups=true"
	default:
		b.Fatalf("spread: mode %q", mode)
	}
	s := startSystem(b, nodes, groups)
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
	checkPlacement(b, s, mode, topics, nodes)
	urls := make([]string, spreadPublishers)
	for w := range urls {
		// Publisher w writes topic w%3 through node (w/3)%N: each topic is
		// entered through every node alike, as clients that do not know
		// its leader would. (Through node w%N, on three nodes each topic
		// had one entry node, its leader or not by the luck of placement.)
		entry := all[(w/len(topics))%len(all)]
		urls[w] = entry.URL() + "/v1/topics/" + topics[w%len(topics)] + "/messages"
	}
	return spreadCluster{s: s, nodes: all, urls: urls, leaders: leaders}
}

// spread is one BenchmarkSpread case: b.N messages as fast as the
// publishers go.
func spread(b *testing.B, mode string, nodes, ntopics int) {
	sc := startSpread(b, mode, nodes, ntopics)
	body := payload(payloadSize)
	op := func(w int, _ int64) (int, error) {
		_, err := sc.s.post(context.Background(), sc.urls[w], body, nil, http.StatusCreated)
		return 1, err
	}
	before := nodesCPU(b, sc.nodes)
	b.ResetTimer()
	n, lat, elapsed, err := driver{workers: spreadPublishers, next: untilN(b.N)}.run(op)
	b.StopTimer()
	after := nodesCPU(b, sc.nodes)
	if err != nil {
		b.Fatal(err)
	}
	ms := []metric{{float64(n) / elapsed.Seconds(), "msgs/s"}}
	per := make([]float64, len(sc.nodes))
	var total float64
	for i := range sc.nodes {
		per[i] = float64(after[i]-before[i]) / float64(time.Microsecond) / float64(n)
		total += per[i]
		ms = append(ms, metric{per[i], fmt.Sprintf("node%d_us/msg", i+1)})
	}
	busiest := slices.Max(per)
	ms = append(ms, metric{total, "cluster_us/msg"}, metric{busiest / total, "busiest_share"},
		metric{float64(sc.leaders), "leaders"},
		metric{float64(runtime.NumCPU()) * float64(time.Second/time.Microsecond) / busiest, "model_msgs/s"})
	report(b, append(ms, latencyMetrics("", lat)...))
}

// topicPlacement is a topic's placement as GET /v1/topics/{topic} on the
// cluster's leader answers it.
type topicPlacement struct {
	Group    string   `json:"group"` // "" for the default group
	Replicas []string `json:"replicas"`
	Leader   string   `json:"leader"`
}

func placementOf(b *testing.B, s *system, topic string) topicPlacement {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.leader.Do(ctx, http.MethodGet, "/v1/topics/"+topic, nil, nil)
	var ans struct {
		Placement *topicPlacement `json:"placement"`
	}
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err == nil {
		err = r.JSON(&ans)
	}
	if err == nil && ans.Placement == nil {
		err = errors.New("no placement in the answer")
	}
	if err != nil {
		b.Fatalf("topic %s: %v", topic, err)
	}
	return *ans.Placement
}

// topicLeaders counts the distinct nodes leading topics (a topic whose
// answer names no leader counts as led by the cluster's leader).
func topicLeaders(b *testing.B, s *system, topics []string) int {
	b.Helper()
	seen := map[string]bool{}
	for _, t := range topics {
		if p := placementOf(b, s, t); p.Leader != "" {
			seen[p.Leader] = true
		} else {
			seen[s.leader.ID()] = true
		}
	}
	return len(seen)
}

// checkPlacement fails b unless every topic is where mode puts it: in the
// default group, on every node, for "single"; in a data group of three
// replicas (every node when fewer) for "data". So a binary whose
// --data-groups default is not what the mode passes, or that ignores the
// flag, cannot measure the other mode unnoticed.
func checkPlacement(b *testing.B, s *system, mode string, topics []string, nodes int) {
	b.Helper()
	for _, t := range topics {
		p := placementOf(b, s, t)
		single := p.Group == "" && len(p.Replicas) == nodes
		data := p.Group != "" && len(p.Replicas) == min(3, nodes)
		if (mode == "single" && !single) || (mode == "data" && !data) {
			b.Fatalf("groups=%s: topic %s is placed in group %q on %v", mode, t, p.Group, p.Replicas)
		}
	}
}
