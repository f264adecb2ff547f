package group

import (
	"fmt"
	"testing"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// BenchmarkLeaseAck measures a group's state changes per consumed message:
// a lease of 100 new keyless messages in one transaction, then their ack in
// another, as the FSM applies them (one partition, 1 KiB values), with one
// record per message and with range lease records (spans). Commits do not
// fsync: the figure is the CPU of the B+tree work.
func BenchmarkLeaseAck(b *testing.B) {
	for _, spans := range []bool{false, true} {
		b.Run(fmt.Sprintf("spans=%v", spans), func(b *testing.B) {
			db := mustDB(b)
			mustTopic(b, db, "t", 1)
			val := make([]byte, 1024)
			const batch = 100
			n := (b.N/batch + 1) * batch
			for i := 0; i < n; i += 1000 {
				if err := db.Update(func(tx *bolt.Tx) error {
					part, err := mlog.OpenPartition(tx, "t", 0)
					if err != nil {
						return err
					}
					for j := 0; j < 1000; j++ {
						if _, err := part.Append(&mlog.Message{PublishedAt: 1, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: val}); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			open := func(tx *bolt.Tx) *Group {
				l, err := mlog.Open(tx, "t")
				if err != nil {
					b.Fatal(err)
				}
				g, err := Open(tx, l, "g", true, 1)
				if err != nil {
					b.Fatal(err)
				}
				if spans {
					g.UseSpans()
				}
				return g
			}
			b.ResetTimer()
			idx := uint64(10)
			for done := 0; done < b.N; done += batch {
				idx++
				var ds []Delivery
				if err := db.Update(func(tx *bolt.Tx) error {
					var err error
					ds, err = open(tx).Lease(1000, 30000, batch, idx, false)
					return err
				}); err != nil {
					b.Fatal(err)
				}
				idx++
				if err := db.Update(func(tx *bolt.Tx) error {
					st, err := open(tx).Ack(1001, idx, receiptsOf(ds))
					if err == nil && (len(st) != batch || st[batch-1] != StatusOK) {
						b.Fatalf("ack = %v", st)
					}
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "us/msg")
		})
	}
}
