package replica

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// A data dir keeps the raft log store it was created with, whatever is
// asked for later, and its entries are read back from that store.

// testSegment is raft-wal's default segment size, what a data dir on a
// filesystem of 1 GiB or more gets (raftfsm sizes them to the volume).
const testSegment = 64 << 20

func TestRaftStoresKeepTheirKind(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hlog := hclog.NewNullLogger()
	for _, created := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(created, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenStores(dir, created, testSegment, logger, hlog)
			if err != nil {
				t.Fatal(err)
			}
			if s.Kind != created {
				t.Fatalf("new data dir: kind %q, want %q", s.Kind, created)
			}
			if err := s.Log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			_, walErr := os.Stat(filepath.Join(dir, walDir))
			if (created == LogStoreWAL) != (walErr == nil) {
				t.Fatalf("created with %s: wal dir stat: %v", created, walErr)
			}
			other := LogStoreWAL
			if created == LogStoreWAL {
				other = LogStoreBolt
			}
			s, err = OpenStores(dir, other, testSegment, logger, hlog)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Kind != created {
				t.Fatalf("reopened asking for %s: kind %q, want %q (the store it was created with)", other, s.Kind, created)
			}
			var l raft.Log
			if err := s.Log.GetLog(1, &l); err != nil || string(l.Data) != "x" {
				t.Fatalf("entry 1 after reopen: %+v %v", l, err)
			}
		})
	}
}

// raft-wal v0.4.0 marks the tail segment sealed when the log's tail is
// truncated (raft does it when a follower drops entries an old leader did
// not commit) without writing its index block; the WAL must still open and
// read every entry afterwards (truncatedTailFiler).
func TestWALReopensAfterTailTruncation(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hlog := hclog.NewNullLogger()
	dir := t.TempDir()
	entries := func(from, to uint64, tag string) []*raft.Log {
		var out []*raft.Log
		for i := from; i <= to; i++ {
			out = append(out, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("%s-%d", tag, i))})
		}
		return out
	}
	s, err := OpenStores(dir, LogStoreWAL, testSegment, logger, hlog)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Log.StoreLogs(entries(1, 10, "old")); err != nil {
		t.Fatal(err)
	}
	if err := s.Log.DeleteRange(8, 10); err != nil { // a conflicting suffix
		t.Fatal(err)
	}
	if err := s.Log.StoreLogs(entries(8, 12, "new")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = OpenStores(dir, LogStoreWAL, testSegment, logger, hlog)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := uint64(1); i <= 12; i++ {
		want := fmt.Sprintf("old-%d", i)
		if i >= 8 {
			want = fmt.Sprintf("new-%d", i)
		}
		var l raft.Log
		if err := s.Log.GetLog(i, &l); err != nil || string(l.Data) != want {
			t.Fatalf("entry %d after reopen: %q, %v; want %q", i, l.Data, err, want)
		}
	}
	if last, err := s.Log.LastIndex(); err != nil || last != 12 {
		t.Fatalf("last index %d, %v; want 12", last, err)
	}
}

// After raft compacts the log's head, the entries below the new first index
// are gone for readers too (raft sends a snapshot for them), whichever store.
func TestCompactedEntriesNotServed(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, kind := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(kind, func(t *testing.T) {
			s, err := OpenStores(t.TempDir(), kind, testSegment, logger, hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var logs []*raft.Log
			for i := uint64(1); i <= 100; i++ {
				logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte("x")})
			}
			if err := s.Log.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			if err := s.Log.DeleteRange(1, 50); err != nil {
				t.Fatal(err)
			}
			var l raft.Log
			if err := s.Log.GetLog(10, &l); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("GetLog(10) after compacting 1..50: %v, want raft.ErrLogNotFound", err)
			}
			if err := s.Log.GetLog(51, &l); err != nil || l.Index != 51 {
				t.Fatalf("GetLog(51): %+v %v", l, err)
			}
		})
	}
}
