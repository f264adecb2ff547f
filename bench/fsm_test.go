// Component benchmarks of the write path, in process, without raft or HTTP.
//
//	go test -run '^$' -bench FSMApplyBatch ./bench/
//	go test -run '^$' -bench LogAppend -benchtime 200000x ./bench/
//
// b.N is the number of messages, so ns/op, B/op and allocs/op are per
// message; msgs/s is the same figure as a rate.

package bench

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// boltOpts are the FSM's bbolt options (raftfsm/fsm.go).
var boltOpts = &bolt.Options{
	NoSync:          true,
	NoFreelistSync:  true,
	FreelistType:    bolt.FreelistMapType,
	InitialMmapSize: 1 << 30,
}

func openBolt(b *testing.B) *bolt.DB {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "bench.db"), 0o600, boltOpts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// splitmix64 scrambles i: keys made from it arrive in random order, like
// UUIDs.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// randomKey appends the 32 hex digits of key i (a UUID's worth of entropy) to dst.
func randomKey(dst []byte, i uint64) []byte {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], splitmix64(i))
	binary.BigEndian.PutUint64(raw[8:], splitmix64(i^0x5bd1e9955bd1e995))
	return hex.AppendEncode(dst, raw[:])
}

// BenchmarkFSMApplyBatch applies raft log entries the way the leader's
// batcher makes them: one OpMulti entry of 512 OpPublish commands of one
// 1 KiB message each, one entry per FSM.ApplyBatch (one bbolt write
// transaction); batch=16 is the size of a c=16 publisher's group commit.
// keys=true gives every message a unique, random-order
// idempotency key (looked up, then recorded in the key and expiry indexes).
// Building and encoding the entries is outside the timer; the FSM's decode
// is inside. Each b.N round starts from an empty FSM.
func BenchmarkFSMApplyBatch(b *testing.B) {
	for _, batch := range []int{16, 512} {
		for _, keyed := range []bool{false, true} {
			b.Run(fmt.Sprintf("keys=%v/batch=%d", keyed, batch), func(b *testing.B) {
				benchApplyBatch(b, batch, keyed)
			})
		}
	}
}

func benchApplyBatch(b *testing.B, batch int, keyed bool) {
	val := payload(payloadSize)
	f, err := fsm.OpenFSM(filepath.Join(b.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	now := time.Now().UnixMilli()
	var idx uint64
	entry := func(c *command.Command) []*raft.Log {
		idx++
		return []*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()}}
	}
	if r := f.ApplyBatch(entry(&command.Command{Op: command.OpPutTopic, Now: now, Topic: "t"}))[0].(*fsm.Result); r.Err != nil {
		b.Fatal(r.Err)
	}
	var out []interface{}
	check := func() {
		if out == nil {
			return
		}
		for _, r := range out[0].(*fsm.Result).Multi {
			if r.Err != nil || len(r.Published) != 1 || r.Published[0].Duplicate {
				b.Fatalf("publish result %+v", r)
			}
		}
	}
	var key []byte
	var applying time.Duration
	cpu0 := processCPU()
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		check()
		k := min(batch, b.N-done)
		multi := &command.Command{Op: command.OpMulti, Now: now, Batch: make([]*command.Command, k)}
		for j := range multi.Batch {
			m := &mlog.Message{PublishedAt: now, MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1, Value: val}
			if keyed {
				key = randomKey(key[:0], uint64(done+j))
				m.IdempotencyKey = string(key)
			}
			multi.Batch[j] = &command.Command{Op: command.OpPublish, Now: now, Topic: "t", Msgs: []mlog.Placed{{Msg: m}}}
		}
		logs := entry(multi)
		b.StartTimer()
		t0 := time.Now()
		out = f.ApplyBatch(logs)
		applying += time.Since(t0)
		done += k
		now++
	}
	b.StopTimer()
	check()
	b.ReportMetric(float64(b.N)/applying.Seconds(), "msgs/s")
	// CPU of the whole loop (building the entries included, the same on
	// both sides): steadier than wall time on a shared machine.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu_us/msg")
}

// BenchmarkLogAppend appends 1 KiB messages to one partition with
// log.Partition.Append, 512 per bbolt write transaction (as one batch of
// the FSM would), commit included, bbolt opened like the FSM's (NoSync).
func BenchmarkLogAppend(b *testing.B) {
	const batch = 512
	b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
		db := openBolt(b)
		if err := db.Update(func(tx *bolt.Tx) error {
			if err := mlog.Init(tx); err != nil {
				return err
			}
			_, err := mlog.PutTopic(tx, "t", mlog.Patch{})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		m := &mlog.Message{PublishedAt: time.Now().UnixMilli(), MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1,
			Value: payload(payloadSize)}
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; {
			k := min(batch, b.N-done)
			if err := db.Update(func(tx *bolt.Tx) error {
				l, err := mlog.Open(tx, "t")
				if err != nil {
					return err
				}
				p, err := l.Partition(0)
				if err != nil {
					return err
				}
				for range k {
					if _, err := p.Append(m); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			done += k
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
