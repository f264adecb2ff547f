package fsm

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	mlog "github.com/mqd/mqd/log"
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
	f, err := OpenFSM(filepath.Join(b.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	now := time.Now().UnixMilli()
	var idx uint64
	apply := func(c *command.Command) {
		idx++
		r := f.ApplyBatch([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()}})[0].(*Result)
		if r.Err != nil {
			b.Fatal(r.Err)
		}
	}
	apply(&command.Command{Op: command.OpPutTopic, Now: now, Topic: "t"})
	val := make([]byte, 1024)
	publish := func() {
		m := &mlog.Message{PublishedAt: now, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: val}
		apply(&command.Command{Op: command.OpPublish, Now: now, Topic: "t", Msgs: []mlog.Placed{{Msg: m}}})
	}
	for range 2000 {
		publish()
	}
	s0 := f.db.Stats()
	b.ResetTimer()
	for range b.N {
		publish()
	}
	b.StopTimer()
	s1 := f.db.Stats()
	d := s1.Sub(&s0)
	n := float64(b.N)
	b.ReportMetric(float64(d.TxStats.GetWrite())/n, "pages_written/op")
	b.ReportMetric(float64(d.TxStats.GetNodeCount())/n, "nodes/op")
	b.ReportMetric(float64(d.TxStats.GetSpill())/n, "spilled/op")
}
