package fsm

import (
	"strings"
	"testing"

	"github.com/mqd/mqd/command"
)

// BenchmarkApplyOnePublish applies raft entries of one 1 KiB publish each
// (a publisher alone on its group commit, as publish-1 is on every node)
// and reports what each entry's bbolt transaction wrote: pages_written is
// bbolt's page writes per commit (the meta page and the freelist
// included), nodes the B+tree nodes it materialized, spilled the nodes it
// re-serialized. b.N is the number of entries; the topic holds 2,000
// messages before the timer starts.
//
//	go test -run '^$' -bench ApplyOnePublish -benchtime 5000x ./fsm/
func BenchmarkApplyOnePublish(b *testing.B) {
	h := mustFSM(b)
	const now = 1_700_000_000_000
	h.must(&command.Command{Op: command.OpPutTopic, Now: now, Topic: "t"})
	body := strings.Repeat("x", 1024)
	for range 2000 {
		h.must(publish(now, "t", msg(body)))
	}
	s0 := h.f.db.Stats()
	b.ResetTimer()
	for range b.N {
		h.must(publish(now, "t", msg(body)))
	}
	b.StopTimer()
	s1 := h.f.db.Stats()
	d := s1.Sub(&s0)
	n := float64(b.N)
	b.ReportMetric(float64(d.TxStats.GetWrite())/n, "pages_written/op")
	b.ReportMetric(float64(d.TxStats.GetNodeCount())/n, "nodes/op")
	b.ReportMetric(float64(d.TxStats.GetSpill())/n, "spilled/op")
}
