// BenchmarkMetricsScrapeNode: GET /metrics of one real mqd process holding
// 10,000 topics × 4 consumer groups (issue 24: under 1 s).
//
//	go test -run '^$' -bench MetricsScrapeNode -benchtime 1x ./bench/
//	go test -run '^$' -bench MetricsScrapeNode -benchtime 1x ./bench/ -metrics.base 97a38aa
//
// Each b.N round scrapes -metrics.scrapes times (the state takes a minute
// or two to build, so -benchtime 1x). With -metrics.base, the same data
// directory is scraped under the binary of that commit and under this
// tree's, alternating, restarted before each scrape with one warm-up
// scrape after the start: both figures come from one run on the same
// state. The machine's load moves the wall time far more than the
// node's CPU per scrape: compare CPU.

package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/valyala/fasthttp"
)

var (
	flagMetricsTopics = flag.Int("metrics.topics", 10000, "MetricsScrapeNode: topics")
	flagMetricsGroups = flag.Int("metrics.groups", 4, "MetricsScrapeNode: consumer groups per topic")
	flagMetricsBase   = flag.String("metrics.base", "", "MetricsScrapeNode: also scrape under the binary of this commit")
	flagMetricsRounds = flag.Int("metrics.scrapes", 5, "MetricsScrapeNode: timed scrapes per binary and b.N round")
	flagMetricsFlags  = flag.String("metrics.flags", "", "MetricsScrapeNode: more mqd flags, space-separated (e.g. --metrics-group-series=false; not with -metrics.base)")
)

// populate creates topics × groups on the leader, 32 requests at a time,
// and publishes one message to every topic.
func (s *system) populate(b *testing.B, topics, groups int) {
	b.Helper()
	type req struct{ method, path, body string }
	var next atomic.Int64
	per := int64(groups + 2)
	d := driver{workers: 32, next: func() (int64, bool) {
		i := next.Add(1) - 1
		return i, i < int64(topics)
	}}
	_, _, elapsed, err := d.run(func(_ int, i int64) (int, error) {
		t := fmt.Sprintf("scrape-%05d", i)
		reqs := []req{{http.MethodPut, "/v1/topics/" + t, "{}"}}
		for g := range groups {
			reqs = append(reqs, req{http.MethodPut, fmt.Sprintf("/v1/topics/%s/groups/g%d", t, g), ""})
		}
		reqs = append(reqs, req{http.MethodPost, "/v1/topics/" + t + "/messages", `{"value":"x"}`})
		for _, r := range reqs {
			if err := s.do(r.method, s.leader.URL()+r.path, r.body); err != nil {
				return 0, err
			}
		}
		return int(per), nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d topics × %d groups (and published one message to each topic) in %v", topics, groups, elapsed)
}

// do sends one request with the fasthttp client and expects a 2xx answer.
func (s *system) do(method, url, body string) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI(url)
	if body != "" {
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
	}
	if err := s.fast.DoTimeout(req, resp, time.Minute); err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	if c := resp.StatusCode(); c/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, url, c, resp.Body())
	}
	return nil
}

// scrapeStats are the sums over a binary's timed scrapes.
type scrapeStats struct {
	n          int
	wall, cpu  time.Duration
	bytes      int64
	worst      time.Duration
	binaryName string
}

// scrape GETs /metrics of n once and answers its wall time, the node's CPU
// for it (user + system) and the body's length.
func scrape(b *testing.B, cl *http.Client, n *tc.Node) (wall, cpu time.Duration, size int64) {
	b.Helper()
	c0, err := procCPU(n.PID())
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	resp, err := cl.Get(n.URL() + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	size, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
	}
	wall = time.Since(t0)
	c1, err := procCPU(n.PID())
	if err != nil {
		b.Fatal(err)
	}
	return wall, c1 - c0, size
}

func BenchmarkMetricsScrapeNode(b *testing.B) {
	bins := []scrapeStats{{binaryName: "this"}}
	paths := []string{tc.Binary(b)}
	if *flagMetricsBase != "" {
		bins = append(bins, scrapeStats{binaryName: *flagMetricsBase})
		paths = append(paths, tc.BuildAt(b, *flagMetricsBase))
	}
	s := startSystem(b, 1, strings.Fields(*flagMetricsFlags)...)
	s.populate(b, *flagMetricsTopics, *flagMetricsGroups)
	n := s.leader
	cl := &http.Client{Timeout: 2 * time.Minute}
	b.ResetTimer()
	for i := range b.N * *flagMetricsRounds {
		for j := range bins {
			if len(bins) > 1 {
				b.StopTimer()
				if err := n.Stop(); err != nil {
					b.Fatal(err)
				}
				n.SetBinary(paths[j])
				n.Restart()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := n.WaitReady(ctx)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				scrape(b, cl, n) // warm-up: the first scrape after a start reads cold pages
				b.StartTimer()
			}
			wall, cpu, size := scrape(b, cl, n)
			st := &bins[j]
			st.n++
			st.wall += wall
			st.cpu += cpu
			st.bytes = size
			st.worst = max(st.worst, wall)
			if i < 3 {
				b.Logf("%s: scrape %v wall, %v node CPU, %d bytes", st.binaryName, wall, cpu, size)
			}
		}
	}
	b.StopTimer()
	for _, st := range bins {
		suffix := ""
		if st.binaryName != "this" {
			suffix = "_base"
		}
		b.ReportMetric(float64(st.wall.Milliseconds())/float64(st.n), "ms/scrape"+suffix)
		b.ReportMetric(float64(st.worst.Milliseconds()), "worst_ms"+suffix)
		b.ReportMetric(float64(st.cpu.Milliseconds())/float64(st.n), "cpu_ms/scrape"+suffix)
		b.ReportMetric(float64(st.bytes), "bytes"+suffix)
	}
}
