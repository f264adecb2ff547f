package replica

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
	bolt "go.etcd.io/bbolt"
)

// Raft log stores (--raft-log).
const (
	// LogStoreWAL keeps the raft log in hashicorp/raft-wal's append-only
	// segment files under <data-dir>/wal: one fsync per append, no B+tree
	// rewrites, and truncation deletes whole segments.
	LogStoreWAL = "wal"
	// LogStoreBolt keeps the raft log in raft.db (raft-boltdb), next to
	// the stable store.
	LogStoreBolt = "bolt"
)

const (
	raftDBFile = "raft.db" // raft-boltdb: always the stable store; the log too with LogStoreBolt
	walDir     = "wal"     // raft-wal's segments and its wal-meta.db
)

// raft-wal's segments are sized to the data dir's filesystem
// (walSegmentFor, raftfsm/disk.go): raft-wal's default, 64 MiB, on 1 GiB or more.
// An entry holds at most one group-commit batch (a few MiB), so a segment
// holds many, and truncation after a snapshot frees a segment at a time.

// DetectLogStore returns the log store a data dir was created with: a wal
// directory means raft-wal; raft.db alone means raft-boltdb held the log
// (mqd before raft-wal, or --raft-log bolt); neither means a new data dir,
// which takes the configured store.
func DetectLogStore(dir string) (string, bool, error) {
	if _, err := os.Stat(filepath.Join(dir, walDir)); err == nil {
		return LogStoreWAL, true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("data dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, raftDBFile)); err == nil {
		return LogStoreBolt, true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("data dir: %w", err)
	}
	return "", false, nil
}

// Stores are the log and stable stores of one replica.
type Stores struct {
	Kind    string // LogStoreWAL or LogStoreBolt
	Log     raft.LogStore
	Stable  *raftboltdb.BoltStore
	closers []io.Closer // the WAL and its meta store, if the log is on raft-wal
}

// OpenStores opens the stores in dir (raft-wal with segments of
// segmentSize bytes). The wal directory is created
// before raft.db, so a crash between the two leaves a data dir that is
// still recognised as a WAL one.
func OpenStores(dir, want string, segmentSize int, logger *slog.Logger, hlog hclog.Logger) (*Stores, error) {
	kind, existing, err := DetectLogStore(dir)
	if err != nil {
		return nil, err
	}
	switch {
	case !existing:
		kind = want
	case kind != want:
		logger.Warn("data dir keeps the raft log store it was created with", "raft_log", kind, "requested", want)
	default:
		logger.Info("raft log store", "raft_log", kind)
	}
	s := &Stores{Kind: kind}
	if kind == LogStoreWAL {
		wdir := filepath.Join(dir, walDir)
		if err := os.MkdirAll(wdir, 0o700); err != nil {
			return nil, fmt.Errorf("raft wal dir: %w", err)
		}
		// raft-wal's Close leaves its meta store (a bbolt file, locked)
		// open, so a WAL reopened in the same process would wait for the
		// lock forever: the node owns the meta store and closes it itself.
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(wdir, wal.WithSegmentSize(segmentSize), wal.WithLogger(hlog.Named("wal")),
			wal.WithMetaStore(meta), wal.WithSegmentFiler(truncatedTailFiler{segment.NewFiler(wdir, walfs.New())}))
		if err != nil {
			_ = meta.Close()
			return nil, fmt.Errorf("raft wal: %w", err)
		}
		s.Log, s.closers = walLog{w}, []io.Closer{w, meta}
	}
	s.Stable, err = raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(dir, raftDBFile),
		BoltOptions: &bolt.Options{Timeout: 5 * time.Second, FreelistType: bolt.FreelistMapType, NoFreelistSync: true},
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("raft stable store: %w", err)
	}
	if s.Log == nil {
		s.Log = s.Stable
	}
	return s, nil
}

// truncatedTailFiler works around a raft-wal v0.4.0 bug (hashicorp/raft-wal
// issue 31, fixed upstream after the last release the module proxy
// serves): truncating the log's tail — raft does it when a follower drops
// entries an old leader never committed — marks the tail segment sealed in
// the meta store without writing the index block a sealed segment is read
// through, so the next open of the WAL fails every read of it ("sealed
// segment has no index block") and the node cannot start. Such a segment
// is opened the way an unsealed tail is recovered instead: by scanning its
// frames up to the last valid commit, which rebuilds the index in memory.
// Only reads are served from it; the WAL bounds them by the segment's
// MaxIndex, since a truncated tail's later indexes live in the next
// segment.
type truncatedTailFiler struct{ *segment.Filer }

func (f truncatedTailFiler) Open(info types.SegmentInfo) (types.SegmentReader, error) {
	if info.IndexStart == 0 && !info.SealTime.IsZero() {
		return f.Filer.RecoverTail(info)
	}
	return f.Filer.Open(info)
}

// walLog works around another raft-wal v0.4.0 behaviour: after raft
// compacts the log's head (DeleteRange from the first index, after a
// snapshot), entries below the new first index are still served while they
// sit in the unsealed tail segment. They are committed entries, so nothing
// wrong is served, but a leader then replicates the compacted log to a
// follower that needs a snapshot (a wiped node) instead of sending it the
// snapshot. GetLog answers raft.ErrLogNotFound below FirstIndex, as
// raft-boltdb does.
type walLog struct{ *wal.WAL }

func (w walLog) GetLog(index uint64, l *raft.Log) error {
	first, err := w.WAL.FirstIndex()
	if err != nil {
		return err
	}
	if index < first {
		return raft.ErrLogNotFound
	}
	return w.WAL.GetLog(index, l)
}

// Close closes the stores.
func (s *Stores) Close() {
	for _, c := range s.closers {
		if err := c.Close(); err != nil {
			slog.Warn("close raft wal", "err", err)
		}
	}
	if s.Stable != nil {
		_ = s.Stable.Close()
	}
}
