package raftfsm

import (
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
func TestRaftStoresKeepTheirKind(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hlog := hclog.NewNullLogger()
	for _, created := range []string{LogStoreWAL, LogStoreBolt} {
		t.Run(created, func(t *testing.T) {
			dir := t.TempDir()
			s, err := openRaftStores(dir, created, logger, hlog)
			if err != nil {
				t.Fatal(err)
			}
			if s.kind != created {
				t.Fatalf("new data dir: kind %q, want %q", s.kind, created)
			}
			if err := s.log.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("x")}}); err != nil {
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
			s, err = openRaftStores(dir, other, logger, hlog)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.kind != created {
				t.Fatalf("reopened asking for %s: kind %q, want %q (the store it was created with)", other, s.kind, created)
			}
			var l raft.Log
			if err := s.log.GetLog(1, &l); err != nil || string(l.Data) != "x" {
				t.Fatalf("entry 1 after reopen: %+v %v", l, err)
			}
		})
	}
}
