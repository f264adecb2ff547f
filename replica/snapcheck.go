package replica

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/internal/durable"
)

// Snapshots at start. raft's file snapshot store records a CRC-64 (ECMA)
// of each snapshot's state.bin in its meta.json and checks it only when it
// opens the snapshot: a restore at start that meets a bad one tries the
// next older one, and with none left refuses to start ("failed to load any
// existing snapshots"). When fsm.db does not cover the latest snapshot (so
// raft will restore one), the node checks them itself first, newest first,
// and moves each that fails to snapshots.damaged/ (kept, never deleted):
// raft then restores the newest good one, or, with none, replays its log
// from the start. A snapshot fsm.db covers is not read at start (that
// would cost a read of the whole state at every restart).

// snapshotIntact reports whether the snapshot id in dir holds the state
// its meta.json's CRC describes, and why not.
func snapshotIntact(dir, id string) (bool, string) {
	b, err := os.ReadFile(filepath.Join(dir, id, "meta.json"))
	if err != nil {
		return false, "meta.json: " + err.Error()
	}
	var meta struct{ CRC []byte }
	if err := json.Unmarshal(b, &meta); err != nil {
		return false, "meta.json: " + err.Error()
	}
	f, err := os.Open(filepath.Join(dir, id, "state.bin"))
	if err != nil {
		return false, "state.bin: " + err.Error()
	}
	defer f.Close()
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	if _, err := io.Copy(h, f); err != nil {
		return false, "state.bin: " + err.Error()
	}
	if sum := h.Sum(nil); !bytes.Equal(sum, meta.CRC) {
		return false, fmt.Sprintf("state.bin's CRC is %x, meta.json records %x", sum, meta.CRC)
	}
	return true, ""
}

// SetAsideBadSnapshots checks the snapshots the store in dataDir lists,
// newest first, until one is intact, moving those that are not to
// snapshots.damaged/; recovered is told of each one moved.
func SetAsideBadSnapshots(dataDir string, store raft.SnapshotStore, logger *slog.Logger, recovered func(reason string)) error {
	dir := snapshotStoreDir(dataDir)
	list, err := store.List()
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, m := range list {
		ok, why := snapshotIntact(dir, m.ID)
		if ok {
			return nil
		}
		aside, err := moveSnapshotAside(dataDir, m.ID)
		if err != nil {
			return err
		}
		logger.Error("snapshot damaged: "+why+"; it was moved aside, raft restores an older one or replays the log (or gets the leader's)",
			"snapshot", m.ID, "snapshot_index", m.Index, "set_aside_as", aside)
		recovered("snapshot_crc")
	}
	return nil
}

// moveSnapshotAside renames snapshots/snapshots/<id> to snapshots.damaged/<id>-<UTC time>.
func moveSnapshotAside(dataDir, id string) (string, error) {
	dst := filepath.Join(dataDir, "snapshots.damaged")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return "", fmt.Errorf("set aside snapshot: %w", err)
	}
	aside := filepath.Join(dst, id+"-"+time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Rename(filepath.Join(snapshotStoreDir(dataDir), id), aside); err != nil {
		return "", fmt.Errorf("set aside snapshot: %w", err)
	}
	for _, d := range []string{snapshotStoreDir(dataDir), dst, dataDir} {
		if err := durable.SyncDir(d); err != nil {
			return "", fmt.Errorf("set aside snapshot: %w", err)
		}
	}
	return aside, nil
}

// SyncSnapshotDirs fsyncs the snapshot store's directory and each
// snapshot's own: raft's store fsyncs state.bin, meta.json and the parent
// after renaming a finished snapshot into place, but not the snapshot's
// directory, whose entries name those two files.
func SyncSnapshotDirs(dataDir string) error {
	dir := snapshotStoreDir(dataDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := durable.SyncDir(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := durable.SyncDir(dir); err != nil {
		return err
	}
	return durable.SyncDir(filepath.Dir(dir))
}

// snapshotStoreDir is where raft's file store keeps the snapshots: a
// "snapshots" directory inside the one it is given (data dir/snapshots).
func snapshotStoreDir(dataDir string) string {
	return filepath.Join(dataDir, "snapshots", "snapshots")
}
