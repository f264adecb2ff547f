package fsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/mqd/mqd/internal/durable"
	bolt "go.etcd.io/bbolt"
)

// Damaged files never become answers: fsm.db is checked at open, and a
// file that fails (or makes bbolt fail or panic) is set aside under a new
// name, never deleted, and the state rebuilt from the latest snapshot and
// the raft log — or, where those do not reach back far enough, from the
// leader's snapshot. Every such decision is one log line and a count in
// mqd_fsm_recoveries_total{reason} (docs/reliability.md has the matrix).

// damage is why fsm.db (or a snapshot) cannot be used.
type damage struct {
	reason string // the metric's label
	detail string
}

func (d *damage) Error() string { return d.reason + ": " + d.detail }

// fsmCheckMaxBytes is the largest fsm.db (by bbolt's high-water mark) whose
// whole page tree bbolt's consistency check (tx.Check) walks at open:
// the walk of every key and tx.Check together measured 154 ms for 147 MiB
// of 1 KiB messages with the file in the page cache on the shared test
// machine (about 1 s per GiB, so about 2 s at the bound); from a cold disk
// it costs reading the file. A larger file gets
// the checks that do not grow with it (the meta pages, the file's length
// against the tree's, the applied index) and the open's log line says the
// tree was not checked.
var fsmCheckMaxBytes int64 = 2 << 30

// preCheck checks what does not need bbolt: that a meta page is valid,
// that it is want (if not nil: a clean close's), and that the file is long
// enough for the tree it describes (bbolt faults reading past the end).
func preCheck(path string, want []byte) (boltMeta, error) {
	meta, m, size, err := currentMeta(path)
	if err != nil {
		return m, err
	}
	if want != nil && !sameMeta(meta, want) {
		return m, &damage{reason: "changed_after_close", detail: fmt.Sprintf(
			"its meta page (transaction %d) is not the one recorded at the clean close (transaction %d): the file was replaced or written by something else",
			m.txid, parseMeta(want).txid)}
	}
	if need := int64(m.pgid) * int64(m.pageSize); size < need {
		return m, &damage{reason: "truncated", detail: fmt.Sprintf("%d bytes long, its tree needs %d", size, need)}
	}
	if m.root >= m.pgid || (m.freelist != boltNoFreelist && m.freelist >= m.pgid) {
		return m, &damage{reason: "meta_invalid", detail: "the meta page points past the end of the tree"}
	}
	return m, nil
}

// openChecked opens the fsm.db at path and runs bbolt's check of it. Any
// failure, including a panic or a memory fault inside bbolt, is a *damage.
func openChecked(path string) (db *bolt.DB, checked bool, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				closeQuietly(db)
			}
			db, err = nil, &damage{reason: "bbolt_panic", detail: fmt.Sprint(r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, boltOpts)
	if err != nil {
		return nil, false, openError(err)
	}
	// Checked before anything is written to it.
	checked, err = checkTree(db, walkTree)
	if err != nil {
		closeQuietly(db)
		return nil, false, err
	}
	if err := initDB(db); err != nil {
		db = nil
		return nil, false, openError(err)
	}
	return db, checked, nil
}

// checkTree runs bbolt's consistency check of the page tree (tx.Check)
// on a file no larger than fsmCheckMaxBytes; it reports whether it ran.
// walk first reads every reachable page on this goroutine: tx.Check runs
// in a goroutine of its own, where a page id or key that points outside
// the file is a memory fault no recover catches, while here it is a panic
// (openChecked sets SetPanicOnFault).
func checkTree(db *bolt.DB, walk func(*bolt.Tx) error) (bool, error) {
	tx, err := db.Begin(false)
	if err != nil {
		return false, &damage{reason: "open_failed", detail: err.Error()}
	}
	defer func() { _ = tx.Rollback() }()
	if tx.Size() > fsmCheckMaxBytes {
		return false, nil
	}
	if err := walkRecovered(tx, walk); err != nil {
		return true, &damage{reason: "check_failed", detail: err.Error()}
	}
	var errs []string
	for e := range tx.Check() {
		if len(errs) < 3 {
			errs = append(errs, e.Error())
		}
	}
	if len(errs) > 0 {
		return true, &damage{reason: "check_failed", detail: strings.Join(errs, "; ")}
	}
	return true, nil
}

// walkRecovered runs walk, turning a panic (or a memory fault, under
// SetPanicOnFault) into an error.
func walkRecovered(tx *bolt.Tx, walk func(*bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the tree: %v", r)
		}
	}()
	return walk(tx)
}

// walkSink keeps the compiler from dropping walkTree's reads.
var walkSink byte

// walkTree visits every key and value of every bucket of tx, reading the
// first and last byte of each: every reachable page is read, on the
// calling goroutine.
func walkTree(tx *bolt.Tx) error {
	var acc byte
	var walk func(b *bolt.Bucket, depth int) error
	walk = func(b *bolt.Bucket, depth int) error {
		if depth > 64 {
			return errors.New("buckets nested more than 64 deep")
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) > 0 {
				acc ^= k[0] ^ k[len(k)-1]
			}
			if v == nil {
				if c := b.Bucket(k); c != nil {
					return walk(c, depth+1)
				}
				return nil
			}
			if len(v) > 0 {
				acc ^= v[0] ^ v[len(v)-1]
			}
			return nil
		})
	}
	err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b, 0) })
	walkSink ^= acc
	return err
}

// openError sorts a bbolt error at open: one from the system (out of
// memory or address space, permissions, an I/O error) is not the file's
// fault and stops the start, as setting the file aside would not help;
// any other (bbolt's checks of the file's content) is damage.
func openError(err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return &damage{reason: "open_failed", detail: err.Error()}
	}
	if errno == syscall.ENOMEM {
		return fmt.Errorf("open fsm db: %w (fsm.db is mapped into %d GiB of address space: "+
			"raise the process's address-space limit, ulimit -v)", err, fsmMmapSize>>30)
	}
	return fmt.Errorf("open fsm db: %w", err)
}

// closeQuietly closes a bbolt file that failed a check; bbolt may panic
// on the damaged file here too.
func closeQuietly(db *bolt.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// setAside renames the file at path (and a partial restore next to it)
// to path.damaged-<UTC time>, and fsyncs the directory. It returns the
// new name ("" if there was no file).
func setAside(path string) (string, error) {
	_ = os.Remove(path + ".restore") // a partial copy of a snapshot that is still in the store
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	aside := asideName(path, "damaged")
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("set aside %s: %w", path, err)
	}
	if err := durable.SyncDir(filepath.Dir(path)); err != nil {
		return "", fmt.Errorf("set aside %s: %w", path, err)
	}
	return aside, nil
}

// asideName is a name beside path for a file kept as evidence:
// path.<what>-<UTC time>, with a number after it if that is taken.
func asideName(path, what string) string {
	stamp := time.Now().UTC().Format("20060102T150405Z")
	aside := path + "." + what + "-" + stamp
	for i := 2; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, os.ErrNotExist) {
			return aside
		}
		aside = fmt.Sprintf("%s.%s-%s-%d", path, what, stamp, i)
	}
}

// RecordRecovery counts a recovery decision (mqd_fsm_recoveries_total):
// those made in OpenFSM, before the node's metrics exist, are kept until
// OnRecovery is set.
func (f *FSM) RecordRecovery(reason string) {
	f.recMu.Lock()
	defer f.recMu.Unlock()
	if f.onRecovery == nil {
		f.pendingRec = append(f.pendingRec, reason)
		return
	}
	f.onRecovery(reason)
}

// OnRecovery sets the function that counts recovery decisions, and hands
// it those made so far.
func (f *FSM) OnRecovery(fn func(reason string)) {
	f.recMu.Lock()
	defer f.recMu.Unlock()
	f.onRecovery = fn
	for _, r := range f.pendingRec {
		fn(r)
	}
	f.pendingRec = nil
}
