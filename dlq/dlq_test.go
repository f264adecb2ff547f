package dlq

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

func mustStore(t *testing.T, fn func(s *Store)) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "d.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		gb, err := tx.CreateBucket([]byte("g"))
		if err != nil {
			return err
		}
		s, err := Open(gb, true)
		if err != nil {
			return err
		}
		fn(s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func letter(i int, key string) *Letter {
	return &Letter{Partition: uint32(i % 2), Offset: uint64(i), RejectReason: fmt.Sprint("r", i), RetryCount: 3, DeadAt: 99,
		Msg:     &mlog.Message{IdempotencyKey: key, Value: []byte(fmt.Sprint("v", i)), MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1},
		History: []Failure{{At: 1, Kind: KindNack, Reason: "a", Node: "n1"}, {At: 2, Kind: KindLeaseExpired, Node: "n2"}}}
}

func TestAddListDelete(t *testing.T) {
	mustStore(t, func(s *Store) {
		for i := 0; i < 10; i++ {
			key := ""
			if i%3 == 0 {
				key = "k"
			}
			if id, err := s.Add(letter(i, key)); err != nil || id != uint64(i+1) {
				t.Fatalf("Add %d = %d, %v", i, id, err)
			}
		}
		page, err := s.List(0, 4, "")
		if err != nil || len(page) != 4 || page[0].ID != 1 || page[3].ID != 4 {
			t.Fatalf("first page = %v, %v", page, err)
		}
		if l := page[2]; string(l.Msg.Value) != "v2" || l.RejectReason != "r2" || len(l.History) != 2 || l.History[1].Kind != KindLeaseExpired {
			t.Errorf("letter 3 round trip: %+v", l)
		}
		page, _ = s.List(8, 4, "")
		if len(page) != 2 || page[0].ID != 9 {
			t.Errorf("last page = %v", page)
		}
		byKey, _ := s.List(0, 10, "k")
		if len(byKey) != 4 || byKey[1].ID != 4 {
			t.Errorf("by key = %d letters (first %v), want ids 1,4,7,10", len(byKey), byKey)
		}
		if _, err := s.Delete(4); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Delete(4); !errors.Is(err, ErrNotFound) {
			t.Errorf("second delete: %v, want ErrNotFound", err)
		}
		if byKey, _ = s.List(0, 10, "k"); len(byKey) != 3 || s.Count() != 9 {
			t.Errorf("after delete: %d by key, count %d", len(byKey), s.Count())
		}
	})
}

func TestReplayQueue(t *testing.T) {
	mustStore(t, func(s *Store) {
		for i := 0; i < 6; i++ {
			if _, err := s.Add(letter(i, "")); err != nil {
				t.Fatal(err)
			}
		}
		n, err := s.QueueReplay([]uint64{2, 5, 42}, false, 7)
		if err != nil || n != 2 {
			t.Fatalf("QueueReplay ids = %d, %v; want 2 (42 does not exist)", n, err)
		}
		if n, _ = s.QueueReplay(nil, true, 9); n != 4 {
			t.Fatalf("QueueReplay all = %d, want the 4 not yet queued", n)
		}
		if s.ReplayPending() != 6 || s.ReplayRate() != 9 {
			t.Errorf("pending %d rate %d, want 6 and 9", s.ReplayPending(), s.ReplayRate())
		}
		// A letter added after "all" is not part of the replay.
		if _, err := s.Add(letter(7, "")); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for range 10 {
			ls, err := s.NextReplay(4)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) == 0 {
				break
			}
			for _, l := range ls {
				got = append(got, l.ID)
			}
		}
		if fmt.Sprint(got) != "[1 2 3 4 5 6]" {
			t.Errorf("replayed %v, want 1..6 once each", got)
		}
		if s.ReplayPending() != 0 || s.Count() != 1 || s.ReplayRate() != 0 {
			t.Errorf("after replay: pending %d count %d rate %d", s.ReplayPending(), s.Count(), s.ReplayRate())
		}
	})
}

func TestHistoryBounded(t *testing.T) {
	var h []Failure
	for i := 0; i < 200; i++ {
		h = AppendHistory(h, Failure{At: int64(i)})
	}
	if len(h) != MaxHistory || h[0].At != 0 || h[1].At != 200-MaxHistory+1 || h[len(h)-1].At != 199 {
		t.Errorf("history kept %d entries: first %d, second %d, last %d", len(h), h[0].At, h[1].At, h[len(h)-1].At)
	}
}
