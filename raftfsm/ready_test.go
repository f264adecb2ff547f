package raftfsm

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/replica"
)

// A node whose latest entries are not commands (barriers, as each new
// leader's term appends; here many more than one AppendEntries carries),
// or whose log before them was compacted into a snapshot, has applied
// everything committed: it is ready without waiting for the next write.
func TestReadyAfterNonCommandEntriesAndSnapshot(t *testing.T) {
	for _, store := range []string{replica.LogStoreWAL, replica.LogStoreBolt} {
		t.Run(store, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			n := openSingleNode(ctx, t, store)

			if _, err := n.Apply(ctx, &command.Command{Op: command.OpPutTopic, Now: Now().UnixMilli(), Topic: "t"}); err != nil {
				t.Fatalf("create topic: %v", err)
			}
			barriers := func(k int) {
				t.Helper()
				for range k {
					if err := n.Default().Raft().Barrier(10 * time.Second).Error(); err != nil {
						t.Fatalf("barrier: %v", err)
					}
				}
			}
			ready := func(when string) {
				t.Helper()
				if v := n.judgeReady(ctx); !v.Ready {
					t.Fatalf("%s: not ready: %+v (FSM applied %d, raft applied %d, snapshot %d)",
						when, v, n.FSM.AppliedIndex(), n.Default().Raft().AppliedIndex(), n.LastSnapshotIndex())
				}
			}

			// Entries before the snapshot are gone from the log (two kept
			// behind it); the FSM's last command is among them.
			barriers(40)
			if err := n.Default().Raft().Snapshot().Error(); err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			if first, err := n.Default().FirstLogIndex(); err != nil || first <= n.FSM.AppliedIndex()+1 {
				t.Fatalf("log not compacted past the FSM's last command: first index %d (%v), FSM applied %d", first, err, n.FSM.AppliedIndex())
			}
			ready("after a snapshot over the FSM's last command")

			// A run of non-commands longer than one AppendEntries.
			barriers(3 * replica.MaxAppendEntries)
			ready("after a long run of barriers")
		})
	}
}

// openSingleNode opens and bootstraps a one-node cluster on a free port
// with the given log store and two trailing log entries, and waits until
// it serves.
func openSingleNode(ctx context.Context, t *testing.T, store string) *Node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	n, err := Open(Config{ID: "n1", DataDir: t.TempDir(), RaftAddr: addr, HTTPAddr: "127.0.0.1:1",
		TrailingLogs: 2, RaftLog: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		if err := n.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	if err := n.Bootstrap([]command.NodeInfo{n.Info()}); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !n.Serving() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("not serving: %v", ctx.Err())
		}
	}
	return n
}
