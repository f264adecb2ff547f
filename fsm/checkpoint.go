package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Checkpoints: what fsm.db holds after a power loss (ARCHITECTURE.md,
// "Durability argument").
//
// fsm.db is written without fsync, so after a power loss (or a VM restored
// from a host crash, or storage that lost its write cache) any of its
// writes since the last fsync may be missing, in any order. Syncing it
// now and then is not enough on its own: bbolt reuses the pages a later
// transaction frees, and rewrites the synced transaction's meta page two
// commits later, so the synced tree itself is overwritten soon after. A
// checkpoint keeps one synced tree whole on disk:
//
//  1. on the applying goroutine, between batches, a read transaction is
//     opened on the last commit, txid T (applied index K). bbolt never
//     reuses a page of a tree that an open read transaction sees, so T's
//     pages stay as they are until it is closed;
//  2. fsm.db is fsynced: T's pages are on disk;
//  3. the first 80 bytes of T's meta page (page T%2: page header and meta)
//     are read back, and {K, term, T, those bytes} is recorded durably in
//     fsm.db.state;
//  4. the previous checkpoint's read transaction is closed.
//
// After any stop but a clean close, whatever the boot id, the recorded meta
// is written back over both meta pages (fsynced), so bbolt opens the tree
// at T — on disk whole, as it was synced and then never written — and raft
// replays the log after K. A checkpoint is taken at every snapshot (in
// FSM.Snapshot, at the snapshot's own index), so the log after K is always
// kept: raft compacts only up to the snapshot's index minus the trailing
// logs. The restart then reads the log since the last snapshot, as before,
// and applies it: its cost does not grow with the state.
//
// A clean close is a checkpoint of the last commit, with the file fsynced
// and closed: the next open checks that fsm.db's meta page is still that
// one (the file was not replaced or copied over since).

// metaPrefix is how much of a bbolt meta page a checkpoint keeps: the
// 16-byte page header and the 64-byte meta (bbolt v1.5.0,
// internal/common/page.go and meta.go).
const metaPrefix = 80

// bbolt's meta layout, offsets within the page (native byte order).
const (
	metaOffMagic    = 16
	metaOffVersion  = 20
	metaOffPageSize = 24
	metaOffRoot     = 32
	metaOffFreelist = 48
	metaOffPgid     = 56
	metaOffTxid     = 64
	metaOffChecksum = 72
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	boltNoFreelist  = ^uint64(0)
	boltMetaFlag    = 0x04
)

// checkpoint is an applied index whose bbolt tree is whole on disk.
type checkpoint struct {
	index, term uint64 // the applied index and term in the tree
	txid        uint64 // bbolt's transaction id of the tree
	meta        [metaPrefix]byte
	pageSize    uint32
}

// boltMeta is a meta page's fields that the checks use.
type boltMeta struct {
	pageSize                   uint32
	root, freelist, pgid, txid uint64
	valid                      bool
}

func parseMeta(b []byte) boltMeta {
	ne := binary.NativeEndian
	m := boltMeta{
		pageSize: ne.Uint32(b[metaOffPageSize:]),
		root:     ne.Uint64(b[metaOffRoot:]),
		freelist: ne.Uint64(b[metaOffFreelist:]),
		pgid:     ne.Uint64(b[metaOffPgid:]),
		txid:     ne.Uint64(b[metaOffTxid:]),
	}
	h := fnv.New64a()
	h.Write(b[metaOffMagic:metaOffChecksum])
	m.valid = ne.Uint32(b[metaOffMagic:]) == boltMagic && ne.Uint32(b[metaOffVersion:]) == boltVersion &&
		ne.Uint64(b[metaOffChecksum:]) == h.Sum64() && m.pageSize >= 1024 && m.pageSize&(m.pageSize-1) == 0
	return m
}

// pinMaxBytes is the largest fsm.db (by bbolt's high-water mark) that keeps
// checkpoints. An open read transaction holds bbolt's mmap lock, and a
// commit that grows the file past the mapped size remaps it, which waits
// for every read transaction: the checkpoint's would never end. The map is
// made large (boltOpts.InitialMmapSize, address space only), and
// checkpoints stop pinPad short of it; a larger state rebuilds from its
// latest snapshot after an unclean stop instead (and says so).
var pinMaxBytes = int64(fsmMmapSize) - pinPad

const pinPad = 8 << 30

// fsmMmapSize is the address space bbolt maps fsm.db into: 64 GiB on a
// 64-bit system (the file itself is only as large as the state).
var fsmMmapSize = func() int {
	if strconv.IntSize == 64 {
		return 1 << 36
	}
	return 1 << 30
}()

// checkpointEvery is how often the checkpoint moves to the last commit
// while batches are applied. Pages that commits free while a checkpoint
// holds its tree are reused only after the next one (bbolt keeps every
// page an open read transaction might see, and does not track which
// pages it allocated at the end of the file); this, and a checkpoint as
// soon as ckptPendingMax pages wait, bound the space they take.
var checkpointEvery = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(TestCheckpointIntervalEnv)); err == nil && d > 0 {
		return d
	}
	return time.Second
}()

// TestCheckpointIntervalEnv sets checkpointEvery, for tests only (and, set
// at all, turns off the checkpoint on freed pages): a test that damages
// fsm.db sets it long, so that the checkpoint stays where the node opened. Never set it in production (a long interval keeps more
// freed pages from reuse).
const TestCheckpointIntervalEnv = "MQD_TEST_CHECKPOINT_INTERVAL"

// ckptPendingMax is how many freed pages may wait for the checkpoint to
// move before the applying goroutine asks for one at once (2 MiB of 8 KiB
// pages): at a high write rate a second's churn would be far more.
var ckptPendingMax = func() int {
	if os.Getenv(TestCheckpointIntervalEnv) != "" {
		return math.MaxInt // the test holds the checkpoint still
	}
	return 256
}()

// kickCheckpoint asks checkpointLoop for a checkpoint now, if it is not
// already asked.
func (f *FSM) kickCheckpoint() {
	select {
	case f.ckKick <- struct{}{}:
	default:
	}
}

// takeCheckpoint records the last commit as the checkpoint (clean: and
// fsm.db is being closed). The caller holds f.mu (read or write); batches
// may be applied meanwhile: the checkpoint is of the commit its read
// transaction sees.
func (f *FSM) takeCheckpoint(clean bool) error {
	f.ckMu.Lock()
	defer f.ckMu.Unlock()
	tx, c, err := f.beginCheckpoint()
	if err != nil {
		return err
	}
	f.size.Store(tx.Size())
	if tx.Size() > pinMaxBytes && !clean {
		_ = tx.Rollback()
		return f.checkpointsOff(tx.Size())
	}
	if err := f.db.Sync(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("checkpoint: fsync fsm.db: %w", err)
	}
	if err := f.state.write(clean, c); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("checkpoint: %w", err)
	}
	f.releasePin()
	f.pin, f.ckpt = tx, c
	return nil
}

// beginCheckpoint opens the read transaction that pins the last commit and
// reads that commit's meta page back from the file. A commit two later
// rewrites the same page: then it tries again with the newer commit.
func (f *FSM) beginCheckpoint() (*bolt.Tx, *checkpoint, error) {
	for try := 0; ; try++ {
		tx, err := f.db.Begin(false)
		if err != nil {
			return nil, nil, fmt.Errorf("checkpoint: %w", err)
		}
		c, err := readCheckpoint(f.path, tx)
		if err == nil {
			return tx, c, nil
		}
		_ = tx.Rollback()
		if !errors.Is(err, errMetaMoved) || try == 20 {
			return nil, nil, err
		}
	}
}

var errMetaMoved = errors.New("checkpoint: the meta page was rewritten by a later commit")

// checkpointLoop moves the checkpoint every checkpointEvery while batches
// are applied, until stop is closed.
func (f *FSM) checkpointLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	var warned time.Time
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-f.ckKick:
		}
		f.ckMu.Lock()
		moved := (f.ckpt == nil || f.ckpt.index != f.applied.Load()) && !f.ckptOffLogged
		f.ckMu.Unlock()
		if !moved {
			continue
		}
		f.mu.RLock()
		err := f.takeCheckpoint(false)
		f.mu.RUnlock()
		if err != nil && time.Since(warned) > time.Minute {
			warned = time.Now()
			f.logger.Warn("fsm.db checkpoint failed; the previous one holds", "err", err)
		}
	}
}

// startCheckpoints starts checkpointLoop; stopCheckpoints ends it.
func (f *FSM) startCheckpoints() {
	f.ckStop, f.ckDone = make(chan struct{}), make(chan struct{})
	if f.ckKick == nil {
		f.ckKick = make(chan struct{}, 1)
	}
	go f.checkpointLoop(f.ckStop, f.ckDone)
}

func (f *FSM) stopCheckpoints() {
	f.ckStopOnce.Do(func() {
		if f.ckStop != nil {
			close(f.ckStop)
			<-f.ckDone
		}
	})
}

// readCheckpoint reads the meta page of tx's commit back from the file.
func readCheckpoint(path string, tx *bolt.Tx) (*checkpoint, error) {
	ps := tx.DB().Info().PageSize
	txid := uint64(tx.ID())
	c := &checkpoint{txid: txid, pageSize: uint32(ps)}
	if err := readAtFull(path, c.meta[:], int64(txid%2)*int64(ps)); err != nil {
		return nil, fmt.Errorf("checkpoint: read meta page: %w", err)
	}
	if m := parseMeta(c.meta[:]); !m.valid || m.txid != txid {
		if !m.valid || m.txid > txid { // rewritten meanwhile (or being rewritten)
			return nil, errMetaMoved
		}
		return nil, fmt.Errorf("checkpoint: meta page %d does not hold transaction %d", txid%2, txid)
	}
	if m := tx.Bucket(bktMeta); m != nil {
		if v := m.Get(keyApplied); len(v) == 8 {
			c.index = binary.BigEndian.Uint64(v)
		}
		if v := m.Get(keyTerm); len(v) == 8 {
			c.term = binary.BigEndian.Uint64(v)
		}
	}
	return c, nil
}

// dropCheckpoint durably records that there is no checkpoint, then lets
// bbolt reuse its pages.
func (f *FSM) dropCheckpoint() error {
	f.ckMu.Lock()
	defer f.ckMu.Unlock()
	return f.dropCheckpointLocked()
}

func (f *FSM) dropCheckpointLocked() error {
	if f.pin == nil && f.ckpt == nil {
		return nil
	}
	if err := f.state.write(false, nil); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	f.ckpt = nil
	f.releasePin()
	return nil
}

func (f *FSM) releasePin() {
	if f.pin != nil {
		_ = f.pin.Rollback()
		f.pin = nil
	}
}

// checkpointsOff drops the checkpoint of a state too large to keep one.
func (f *FSM) checkpointsOff(size int64) error {
	if f.ckpt != nil || !f.ckptOffLogged {
		f.logger.Warn("fsm.db checkpoints off: the state is too large for them; after a stop other than a clean one "+
			"fsm.db will be set aside and rebuilt from the latest snapshot and the raft log",
			"fsm_bytes", size, "limit_bytes", pinMaxBytes)
		f.ckptOffLogged = true
	}
	return f.dropCheckpointLocked()
}

// guardPin drops the checkpoint before a batch that could grow fsm.db
// near the mapped size (see pinMaxBytes). Called on the applying goroutine.
func (f *FSM) guardPin() {
	if f.size.Load() <= pinMaxBytes {
		return
	}
	f.ckMu.Lock()
	defer f.ckMu.Unlock()
	if f.pin == nil {
		return
	}
	if err := f.checkpointsOff(f.size.Load()); err != nil {
		stopOnStorageError(f.logger, f.applied.Load(), err)
		panic(fmt.Sprintf("raftfsm: %v", err))
	}
}

// putCheckpointMeta writes c's meta page over both of fsm.db's meta pages
// and fsyncs the file, so bbolt opens the tree at c.txid. It refuses a
// file too short to hold that tree.
func putCheckpointMeta(path string, c *checkpoint) error {
	m := parseMeta(c.meta[:])
	if !m.valid || m.txid != c.txid || m.pageSize != c.pageSize {
		return &damage{reason: "checkpoint_invalid", detail: "the recorded meta page fails bbolt's checks"}
	}
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer w.Close()
	st, err := w.Stat()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if need := int64(m.pgid) * int64(m.pageSize); st.Size() < need {
		return &damage{reason: "truncated", detail: fmt.Sprintf("%d bytes long, the checkpoint's tree needs %d", st.Size(), need)}
	}
	for slot := uint64(0); slot < 2; slot++ {
		b := c.meta
		binary.NativeEndian.PutUint64(b[0:], slot) // the page header's id
		if _, err := w.WriteAt(b[:], int64(slot)*int64(m.pageSize)); err != nil {
			return fmt.Errorf("checkpoint: write meta page: %w", err)
		}
	}
	if err := w.Sync(); err != nil {
		return fmt.Errorf("checkpoint: fsync fsm.db: %w", err)
	}
	return nil
}

// currentMeta reads the meta page bbolt would open fsm.db at (the valid
// one with the higher txid) and the file's size.
func currentMeta(path string) ([]byte, boltMeta, int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, boltMeta{}, 0, fmt.Errorf("fsm db: %w", err)
	}
	var best []byte
	var bm boltMeta
	head := make([]byte, metaPrefix)
	if err := readAtFull(path, head, 0); err != nil {
		return nil, boltMeta{}, st.Size(), &damage{reason: "truncated", detail: "shorter than a meta page"}
	}
	if m := parseMeta(head); m.valid {
		best, bm = head, m
	}
	// The second meta page is at one page size: the first's, or, when the
	// first is unreadable, whichever size holds a valid one (as bbolt does).
	sizes := []int64{int64(bm.pageSize)}
	if best == nil {
		sizes = []int64{4096, 8192, 16384, 32768, 65536, 1024, 2048}
	}
	for _, ps := range sizes {
		b := make([]byte, metaPrefix)
		if readAtFull(path, b, ps) != nil {
			continue
		}
		if m := parseMeta(b); m.valid && int64(m.pageSize) == ps && (best == nil || m.txid > bm.txid) {
			best, bm = b, m
			break
		}
	}
	if best == nil {
		return nil, boltMeta{}, st.Size(), &damage{reason: "meta_invalid", detail: "neither meta page passes bbolt's checksum"}
	}
	return best, bm, st.Size(), nil
}

// sameMeta reports whether two meta pages describe the same commit (the
// page header's id may differ).
func sameMeta(a, b []byte) bool { return bytes.Equal(a[metaOffMagic:], b[metaOffMagic:]) }

// restartCheckpoints starts checkpointLoop again after stopCheckpoints.
func (f *FSM) restartCheckpoints() {
	f.ckStopOnce = sync.Once{}
	f.startCheckpoints()
}
