package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/raftfsm"
)

// scrapeNode is a leader with no per-group event sums, for scrapes of a
// real state machine in-process.
type scrapeNode struct{ leaderNode }

func (scrapeNode) GroupTallies() map[fsm.TopicGroup]raftfsm.TallyAt    { return nil }
func (scrapeNode) DropGroupTallies(keys []fsm.TopicGroup, upTo uint64) {}

// stateOf applies topics OpPutTopic and topics×groups OpPutGroup commands
// to a new FSM, 1,000 log entries per ApplyBatch (one write transaction),
// as a leader's group commit would.
func stateOf(tb testing.TB, topics, groups int) *fsm.FSM {
	tb.Helper()
	f, err := fsm.OpenFSM(filepath.Join(tb.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	now := time.Now().UnixMilli()
	var idx uint64
	var logs []*raft.Log
	flush := func() {
		if len(logs) == 0 {
			return
		}
		for i, r := range f.ApplyBatch(logs) {
			if res, _ := r.(*fsm.Result); res == nil || res.Err != nil {
				tb.Fatalf("apply %d: %+v", logs[i].Index, r)
			}
		}
		logs = logs[:0]
	}
	add := func(c *command.Command) {
		idx++
		logs = append(logs, &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()})
		if len(logs) == 1000 {
			flush()
		}
	}
	for i := range topics {
		t := fmt.Sprintf("topic-%05d", i)
		add(&command.Command{Op: command.OpPutTopic, Now: now, Topic: t})
		for j := range groups {
			add(&command.Command{Op: command.OpPutGroup, Now: now, Topic: t, Group: fmt.Sprintf("group-%d", j)})
		}
	}
	flush()
	return f
}

// serveLoopback serves s on a loopback TCP port until the benchmark ends
// and answers the URL of its /metrics.
func serveLoopback(tb testing.TB, s *Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-done
	})
	return "http://" + ln.Addr().String() + "/metrics"
}

// BenchmarkMetricsScrape scrapes GET /metrics over loopback HTTP from the
// real handler on a real FSM holding topics × groups (created by applied
// commands): ms per scrape, bytes of text and allocations per scrape;
// group-series=false is a node started with --metrics-group-series=false.
//
//	go test -run '^$' -bench MetricsScrape -benchtime 5x ./api/
func BenchmarkMetricsScrape(b *testing.B) {
	for _, sz := range []struct {
		topics, groups int
		noGroups       bool
	}{{1000, 4, false}, {10000, 4, false}, {10000, 4, true}} {
		b.Run(fmt.Sprintf("topics=%d/groups=%d/group-series=%v", sz.topics, sz.groups, !sz.noGroups), func(b *testing.B) {
			f := stateOf(b, sz.topics, sz.groups)
			s := newServer(scrapeNode{}, f, slog.New(slog.DiscardHandler), Options{NoGroupSeries: sz.noGroups})
			url := serveLoopback(b, s)
			cl := &http.Client{Timeout: time.Minute}
			var size int64
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				resp, err := cl.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("GET /metrics: %d, %v", resp.StatusCode, err)
				}
				size = n
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/scrape")
			b.ReportMetric(float64(size), "bytes")
		})
	}
}

// BenchmarkApplyDuringScrape applies one-message publishes to the FSM of
// 10,000 topics × 4 groups, each its own ApplyBatch (a write transaction),
// while /metrics is scraped over loopback in a loop (scrape=true) or not:
// the apply latency's p50, p99 and maximum. A scrape's read transaction
// shares the FSM's read lock with applies and bbolt lets a writer commit
// beside readers, so the two should match.
//
//	go test -run '^$' -bench ApplyDuringScrape -benchtime 2000x ./api/
func BenchmarkApplyDuringScrape(b *testing.B) {
	f := stateOf(b, 10000, 4)
	s := newServer(scrapeNode{}, f, slog.New(slog.DiscardHandler), Options{})
	url := serveLoopback(b, s)
	idx := f.AppliedIndex()
	val := []byte("0123456789abcdef")
	for _, scraping := range []bool{false, true} {
		b.Run(fmt.Sprintf("scrape=%v", scraping), func(b *testing.B) {
			stop, done := make(chan struct{}), make(chan int)
			go func() {
				n := 0
				for scraping {
					select {
					case <-stop:
						done <- n
						return
					default:
					}
					resp, err := http.Get(url)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						n++
					}
				}
				<-stop
				done <- n
			}()
			if scraping {
				time.Sleep(200 * time.Millisecond) // the first scrape under way
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				idx++
				c := &command.Command{Op: command.OpPublish, Now: time.Now().UnixMilli(), Topic: fmt.Sprintf("topic-%05d", i%10000),
					Msgs: []mlog.Placed{{Msg: &mlog.Message{PublishedAt: 1, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: val}}}}
				t0 := time.Now()
				r := f.ApplyBatch([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()}})
				lat = append(lat, time.Since(t0))
				if res, _ := r[0].(*fsm.Result); res == nil || res.Err != nil {
					b.Fatalf("apply: %+v", r[0])
				}
			}
			b.StopTimer()
			close(stop)
			scrapes := <-done
			slices.Sort(lat)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(lat[len(lat)/2]), "p50_ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99_ms")
			b.ReportMetric(ms(lat[len(lat)-1]), "max_ms")
			b.ReportMetric(float64(scrapes), "scrapes")
		})
	}
}
