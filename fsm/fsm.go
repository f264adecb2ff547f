package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/dedup"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/internal/durable"
	"github.com/mqd/mqd/internal/refusal"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// Result is what applying one command produced, returned to the proposer
// through raft's ApplyFuture.
type Result struct {
	Err        error
	Created    bool
	Published  []Published
	Deliveries []group.Delivery // command.OpLease; each with its Msg on a node that waits for it
	Statuses   []string
	Expected   uint64         // ErrSeqGap: the producer sequence that must come next
	Multi      []*Result      // command.OpMulti: one result per command
	Accepted   uint64         // command.OpReplay, command.OpReplayStep: letters queued or replayed
	Process    *ProcessResult // command.OpProcess (process.go)
	Group      string         // command.OpPlaceTopic: the data group the topic is in
}

// Events is what a batch did that soft state must learn: topics that
// gained deliverable messages, and due times it created.
type Events struct {
	Topics map[string]struct{}
	Timers []group.Timer
	// Tallies: what happened to messages, per topic and group.
	Tallies map[TopicGroup]*group.Tally
	// ConfigChanged: a topic was created, changed or deleted.
	ConfigChanged bool
	// NodesChanged: a node's addresses were recorded.
	NodesChanged bool
	// DirectoryChanged: a data group was recorded or a topic placed
	// (directory.go).
	DirectoryChanged bool
	// Replays: groups whose queue of dead letters to replay changed.
	Replays []TopicGroup
	// Touched: topics a command of the batch named (repeats possible).
	Touched []string
	// leaseMsgs: leases put their messages into the result, as someone
	// on this node waits for a lease (FSM.AwaitLease).
	leaseMsgs bool
	// format is the state's format (format.go), read from the batch's
	// transaction and raised by an OpSetFormat in it: every replica
	// decides alike at every index.
	format int
}

func (e *Events) wake(topic string) { e.Topics[topic] = struct{}{} }

// TopicGroup names a consumer group of a topic.
type TopicGroup struct{ Topic, Group string }

// Tally is where a group's events go in this batch (group.TallySink).
func (e *Events) Tally(topic, name string) *group.Tally {
	k := TopicGroup{topic, name}
	t := e.Tallies[k]
	if t == nil {
		t = &group.Tally{}
		e.Tallies[k] = t
	}
	return t
}

// Published is the placement of one published message.
type Published struct {
	Partition uint32
	Offset    uint64
	Duplicate bool
}

var (
	bktMeta    = []byte("meta")
	bktNodes   = []byte("nodes")
	keyApplied = []byte("applied_index")
	keyTerm    = []byte("applied_term")
	keyNow     = []byte("now") // the latest applied command's time (raftfsm/clock.go)
	// keyRaftConf: the latest raft configuration entry applied, its index
	// (8 bytes) then its data (raftconf.go).
	keyRaftConf = []byte("raft_configuration")
)

// Hooks are the callbacks the node sets on an FSM before raft applies
// anything, each called after a batch commits (on raft's FSM goroutine).
// Any of them may be nil.
type Hooks struct {
	// Schedule is called after each batch commits with the due
	// times the batch created.
	Schedule func(timers []group.Timer)
	// ReplayQueued is called after each batch commits with the
	// groups whose replay queue it changed (the leader paces only those).
	ReplayQueued func([]TopicGroup)
	// TopicsTouched is called after each batch commits with the
	// topics its commands named (the leader checks only those, and topics
	// with time-based retention, for trimming).
	TopicsTouched func([]string)
	// Tally is called after each batch commits with what happened
	// to messages in it (nacks, expired leases, dead letters, replays),
	// except for batches at or below TallyFrom: entries this node had
	// already applied before it restarted and now replays.
	Tally func(map[TopicGroup]*group.Tally)
}

// FSM is the state machine over a bbolt database. Every applied batch is
// one bbolt transaction that also records the last applied raft index and
// term, so the file is opened as it is at start and raft replays only the
// entries after it. It is written without fsync; fsmstate.go says when it
// is trusted after a crash.
type FSM struct {
	path   string
	logger *slog.Logger
	// notify, once set by OnNotify, is called after each batch commits with
	// the topics that gained deliverable messages. Raft's FSM goroutine reads
	// it from the start, so it is an atomic, never a plain field.
	notify atomic.Pointer[func(topics map[string]struct{})]
	// held counts the read transactions snapshots and backups keep open
	// outside mu (heldtx.go).
	held heldTxs
	// Hooks are what the node sets to follow applied batches.
	Hooks
	// TallyFrom: Tally is not called for batches at or below it.
	TallyFrom atomic.Uint64

	mu sync.RWMutex // guards db against Restore's swap
	db *bolt.DB
	// state is fsm.db.state (fsmstate.go); pin is the read transaction
	// that keeps the checkpoint's tree whole on disk, ckpt the checkpoint
	// (checkpoint.go). Used on the applying goroutine, or with mu held.
	state         *stateFile
	pin           *bolt.Tx
	ckpt          *checkpoint
	ckptOffLogged bool
	ckMu          sync.Mutex // guards state, pin, ckpt
	ckStop        chan struct{}
	ckDone        chan struct{}
	ckStopOnce    sync.Once
	ckKick        chan struct{} // asks checkpointLoop for a checkpoint now
	size          atomic.Int64  // bbolt's high-water mark in bytes, after the last commit
	// Recovery decisions, counted by onRecovery (damage.go).
	recMu      sync.Mutex
	onRecovery func(reason string)
	pendingRec []string
	applied    atomic.Uint64
	// opened is the applied index found at open: raft replays entries from
	// its last snapshot on, and those up to here are already in the file.
	opened uint64
	// openedClean: the file was opened as a clean close left it, so it
	// holds every entry this node applied before (not rolled back to a
	// checkpoint).
	openedClean bool
	// live is the applied index and term the file's live tree recorded
	// before OpenFSM rolled it back to its checkpoint (evidence.go).
	live   [2]uint64
	cfgGen atomic.Uint64
	// nodesGen moves after every batch that recorded node addresses (and
	// every restore); nodes caches the addresses read at some generation.
	nodesGen atomic.Uint64
	nodes    atomic.Pointer[nodesCache]
	// dirGen and dir do the same for the directory (directory.go);
	// dirNotify is OnDirectory's function.
	dirGen    atomic.Uint64
	dir       atomic.Pointer[dirCache]
	dirNotify atomic.Pointer[func()]
	now       int64 // ApplyBatch's running time, loaded from and saved to meta "now"
	// format is the state's format (meta "state_format") after the last
	// applied batch, open or restore.
	format atomic.Int32
	// logBytes counts the bytes of raft entries applied since start.
	// seenBytes counts every entry raft hands over since start, those a
	// restart replays that fsm.db already holds too: raft replays the log
	// from its latest snapshot, so they are log since that snapshot.
	// snapBytes is seenBytes at the latest snapshot (taken or restored).
	logBytes  atomic.Uint64
	seenBytes atomic.Uint64
	snapBytes atomic.Uint64
	// snapMu orders CountLogBeforeStart against the snapshots that set
	// snapBytes; snapTaken: one was taken or restored since open.
	snapMu    sync.Mutex
	snapTaken bool
	restores  atomic.Uint64
	// reclaim: the next snapshot is taken to give space back to a low
	// disk, and compacts a sparse state whatever its size (compact.go).
	reclaim atomic.Bool
	// leaseWaiters counts this node's proposers waiting for a lease's
	// result. While there is none (always on a follower) a lease's result
	// carries no messages: nobody would read them.
	leaseWaiters atomic.Int64
}

// AwaitLease registers a proposer of a lease until the returned function
// is called, after its result arrived: every batch applied meanwhile
// copies the leased messages into the lease results.
func (f *FSM) AwaitLease() (done func()) {
	f.leaseWaiters.Add(1)
	return func() { f.leaseWaiters.Add(-1) }
}

// Restores counts the snapshots this FSM restored.
func (f *FSM) Restores() uint64 { return f.restores.Load() }

// BytesSinceSnapshot is how many bytes of raft log this node holds past
// its latest snapshot, as far as raft has handed them to the FSM: after a
// restart, the entries it replays count although fsm.db already held them.
// (Since start, if the node has no snapshot.)
func (f *FSM) BytesSinceSnapshot() uint64 { return f.seenBytes.Load() - f.snapBytes.Load() }

// AppliedBytes is how many bytes of raft entries this node applied since
// it started.
func (f *FSM) AppliedBytes() uint64 { return f.logBytes.Load() }

// Size is the size of the state a snapshot copies, in bytes.
func (f *FSM) Size() int64 {
	var n int64
	_ = f.View(func(tx *bolt.Tx) error {
		n = tx.Size()
		return nil
	})
	return n
}

// ConfigGen counts the batches that changed some topic's configuration
// (and restores). It moves after the change is visible to View, so a
// config read after loading generation g is at least as new as g.
func (f *FSM) ConfigGen() uint64 { return f.cfgGen.Load() }

var boltOpts = &bolt.Options{
	NoSync: true, // durability comes from the raft log; see ARCHITECTURE.md
	// Nor an fsync when the file grows: with NoSync it flushed every dirty
	// page of the file at once, stalling the apply (and every answer
	// waiting on it). Measured at 64 publishers: publish p99 20.5 → 9.0 ms.
	NoGrowSync: true,
	// The free list is written with the commit while it is small, so that
	// opening the file reads it instead of walking every page (about a
	// second per GiB, many more on a busy machine); see syncFreelistIfSmall.
	NoFreelistSync: false,
	FreelistType:   bolt.FreelistMapType,
	// Address space, not memory: a large map keeps bbolt from remapping
	// (which would wait for the checkpoint's read transaction for ever;
	// see pinMaxBytes in checkpoint.go).
	InitialMmapSize: fsmMmapSize,
	// 8 KiB pages, set when the file is created (an existing file keeps
	// its own). Message leaves split full, so a page holds as many whole
	// messages as fit: 1 KiB messages fill 4 KiB pages three to a page
	// (1.34 bytes of file per payload byte) and 8 KiB pages seven to a
	// page (1.14). Larger pages cost the random-key dedup index: each
	// insert dirties a whole leaf. Measured with BenchmarkFSMApplyBatch at
	// 16 keyed publishes per batch, CPU per message 4 KiB 1.0, 8 KiB
	// about 1.25, 16 KiB about 1.8; unkeyed and large batches equal or
	// cheaper (docs/performance.md).
	PageSize: fsmPageSize,
}

const fsmPageSize = 8 << 10

// freelistSyncMax is the most free pages whose list a commit writes
// (8 KiB of page ids, one page). Above it, as after a large backlog was
// trimmed, writing and sorting the whole list at every commit would cost
// more than the apply itself, so commits skip it (and a restart before the
// free pages are used again walks the file to rebuild the list).
const freelistSyncMax = 1024

// syncFreelistIfSmall decides, inside a write transaction, whether its
// commit writes bbolt's free list. Only the applying goroutine writes
// fsm.db, so the DB's NoFreelistSync is read and set by this goroutine
// alone.
func (f *FSM) syncFreelistIfSmall() {
	st := f.db.Stats()
	f.db.NoFreelistSync = st.FreePageN+st.PendingPageN > freelistSyncMax
	if st.PendingPageN > ckptPendingMax {
		f.kickCheckpoint() // pages wait for the checkpoint to move (checkpoint.go)
	}
}

// loadFormat reads the state's format into f.format; a state in a format
// newer than this binary reads is an error (a downgrade: it would misread
// the state's records).
func (f *FSM) loadFormat() error {
	var v int
	_ = f.db.View(func(tx *bolt.Tx) error {
		v = storedFormat(tx)
		return nil
	})
	f.format.Store(int32(v))
	if v > StateFormat {
		return fmt.Errorf("open fsm: %w: %s holds format %d, this binary reads up to %d (run the newer binary)",
			errFormatTooNew, f.path, v, StateFormat)
	}
	return nil
}

// appliedIn reads the applied index and term recorded in the meta bucket.
func appliedIn(m *bolt.Bucket) (index, term uint64) {
	if v := m.Get(keyApplied); len(v) == 8 {
		index = binary.BigEndian.Uint64(v)
	}
	if v := m.Get(keyTerm); len(v) == 8 {
		term = binary.BigEndian.Uint64(v)
	}
	return index, term
}

// storedApplied reads the applied index and term recorded in the file.
func (f *FSM) storedApplied() (index, term uint64) {
	_ = f.db.View(func(tx *bolt.Tx) error {
		index, term = appliedIn(tx.Bucket(bktMeta))
		return nil
	})
	return index, term
}

// OnNotify sets the function called after each batch commits with the
// topics that gained deliverable messages (long-poll waiters). It may be
// called while raft applies entries: a batch applied before it is set wakes
// nobody, which is right, as nobody could wait before it was set.
func (f *FSM) OnNotify(fn func(topics map[string]struct{})) { f.notify.Store(&fn) }

// Wake calls the OnNotify function with topics that gained deliverable
// messages outside an applied batch (the leader's timers).
func (f *FSM) Wake(topics map[string]struct{}) {
	if fn := f.notify.Load(); fn != nil {
		(*fn)(topics)
	}
}

// OpenedIndex is the applied index the file held when it was opened (0 if
// it started empty).
func (f *FSM) OpenedIndex() uint64 { return f.opened }

// OpenedClean reports whether the file was opened as a clean close left
// it: it then holds everything this node applied before this start. After
// any other stop it was rolled back to its last checkpoint, and the node
// had applied more (LostEvidence says how much, when the live tree told).
func (f *FSM) OpenedClean() bool { return f.openedClean }

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, boltOpts)
	if err != nil {
		return nil, fmt.Errorf("open fsm db: %w", err)
	}
	return db, initDB(db)
}

// initDB creates the buckets a new file lacks; it closes db on failure.
func initDB(db *bolt.DB) error {
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bktMeta, bktNodes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := mlog.Init(tx); err != nil {
			return err
		}
		if err := dedup.Init(tx); err != nil {
			return err
		}
		return group.Init(tx)
	})
	if err != nil && errors.Is(err, syscall.ENOSPC) && initialized(db) {
		// A full disk: the commit (of nothing new) could not grow the
		// file; what it would have created is there already.
		err = nil
	}
	if err != nil {
		db.Close()
		return fmt.Errorf("init fsm db: %w", err)
	}
	return nil
}

// initialized reports whether db holds an applied index (openDB ran on it
// before).
func initialized(db *bolt.DB) bool {
	ok := false
	_ = db.View(func(tx *bolt.Tx) error {
		ok = tx.Bucket(bktMeta) != nil && tx.Bucket(bktNodes) != nil && len(tx.Bucket(bktMeta).Get(keyApplied)) == 8
		return nil
	})
	return ok
}

// Close fsyncs and closes the database and records the clean close, with
// the last commit's meta page (checkpoint.go).
func (f *FSM) Close() error {
	f.stopCheckpoints()
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.state.close()
	// The last commit writes the free list whatever its size, so that
	// the next open reads it instead of walking every page of the file
	// (commits skip a large one: syncFreelistIfSmall). On a full disk it
	// may not fit: the next open walks the file then.
	f.db.NoFreelistSync = false
	if err := f.db.Update(func(*bolt.Tx) error { return nil }); err != nil && !errors.Is(err, syscall.ENOSPC) {
		f.ckMu.Lock()
		f.releasePin()
		f.ckMu.Unlock()
		f.db.Close()
		return fmt.Errorf("close fsm: write free list: %w", err)
	}
	err := f.takeCheckpoint(true) // fsyncs fsm.db, then records it clean
	f.ckMu.Lock()
	f.releasePin()
	f.ckMu.Unlock()
	if cerr := f.db.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close fsm: %w", err)
	}
	return nil
}

// View runs fn in a read transaction of the current state.
func (f *FSM) View(fn func(tx *bolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.db.View(fn)
}

// AppliedIndex is the index of the last applied raft log entry.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

// Apply implements raft.FSM for a single entry.
func (f *FSM) Apply(l *raft.Log) interface{} { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch implements raft.BatchingFSM: the whole batch is one bbolt
// transaction, with the applied index and term written in it. Entries at
// or below the applied index are already in the file (raft replays from
// its last snapshot at start) and are skipped.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	last := logs[len(logs)-1]
	var seen, fresh uint64
	for _, l := range logs {
		seen += uint64(len(l.Data))
		if l.Index > f.applied.Load() {
			fresh += uint64(len(l.Data))
		}
	}
	f.seenBytes.Add(seen)
	if last.Index <= f.applied.Load() {
		return out
	}
	ev := &Events{Topics: map[string]struct{}{}, Tallies: map[TopicGroup]*group.Tally{},
		leaseMsgs: f.leaseWaiters.Load() > 0}
	f.mu.RLock()
	defer f.mu.RUnlock()
	f.guardPin()
	err := f.db.Update(func(tx *bolt.Tx) error {
		f.now = 0
		if v := tx.Bucket(bktMeta).Get(keyNow); len(v) == 8 {
			f.now = int64(binary.BigEndian.Uint64(v))
		}
		ev.format = storedFormat(tx)
		for i, l := range logs {
			if l.Type == raft.LogConfiguration && l.Index > f.applied.Load() {
				if err := putRaftConf(tx, l); err != nil {
					return err
				}
			}
			if l.Type != raft.LogCommand || l.Index <= f.applied.Load() {
				continue
			}
			cmd, err := command.Decode(l.Data)
			if err != nil {
				// Replicas would diverge if we skipped it: stop the node.
				panic(fmt.Sprintf("raftfsm: undecodable committed entry at index %d: %v", l.Index, err))
			}
			out[i] = f.applyOne(tx, l.Index, cmd, ev)
		}
		m := tx.Bucket(bktMeta)
		if err := m.Put(keyNow, mlog.U64Key(uint64(f.now))); err != nil {
			return err
		}
		f.syncFreelistIfSmall()
		if err := m.Put(keyApplied, mlog.U64Key(last.Index)); err != nil {
			return err
		}
		f.size.Store(tx.Size())
		return m.Put(keyTerm, mlog.U64Key(last.Term))
	})
	if err != nil {
		stopOnStorageError(f.logger, logs[len(logs)-1].Index, err)
		panic(fmt.Sprintf("raftfsm: apply batch ending at %d: %v", logs[len(logs)-1].Index, err))
	}
	f.applied.Store(logs[len(logs)-1].Index)
	f.format.Store(int32(ev.format))
	f.logBytes.Add(fresh)
	if ev.ConfigChanged {
		f.cfgGen.Add(1)
	}
	if ev.NodesChanged {
		f.nodesGen.Add(1)
	}
	if ev.DirectoryChanged {
		f.directoryChanged()
	}
	if len(ev.Topics) > 0 {
		f.Wake(ev.Topics)
	}
	if len(ev.Timers) > 0 && f.Schedule != nil {
		f.Schedule(ev.Timers)
	}
	if len(ev.Replays) > 0 && f.ReplayQueued != nil {
		f.ReplayQueued(ev.Replays)
	}
	if len(ev.Touched) > 0 && f.TopicsTouched != nil {
		f.TopicsTouched(ev.Touched)
	}
	if len(ev.Tallies) > 0 && f.Tally != nil && logs[len(logs)-1].Index > f.TallyFrom.Load() {
		f.Tally(ev.Tallies)
	}
	return out
}

// applyOne applies a command. Business errors (unknown topic, full topic)
// are detected before anything is written, so a failed command changes
// nothing; any other error is a storage failure and stops the node.
func (f *FSM) applyOne(tx *bolt.Tx, idx uint64, c *command.Command, ev *Events) *Result {
	f.clampNow(c)
	if c.Op == command.OpMulti {
		res := &Result{Multi: make([]*Result, len(c.Batch))}
		for i, sub := range c.Batch {
			res.Multi[i] = f.applyOne(tx, idx, sub, ev)
		}
		return res
	}
	if c.Topic != "" {
		ev.Touched = append(ev.Touched, c.Topic)
	}
	res, err := dispatch(tx, idx, c, ev)
	if err != nil {
		if isBusiness(err) {
			if res == nil {
				res = &Result{}
			}
			res.Err = err
			return res
		}
		panic(fmt.Sprintf("raftfsm: apply %s at index %d: %v", c.Op, idx, err))
	}
	return res
}

// isBusiness: a refusal (package refusal) is the command's answer; any
// other error is a failure that stops the node.
func isBusiness(err error) bool { return refusal.Is(err) }

// clampNow keeps the state's time monotonic: a command stamped before the
// latest applied command's time (a new leader whose clock is behind the
// old one's) is applied at that time instead, on every replica alike. The
// time is part of the state (meta "now"), so snapshots carry it.
func (f *FSM) clampNow(c *command.Command) {
	if c.Now < f.now {
		c.Now = f.now
	} else {
		f.now = c.Now
	}
}

// Now is the latest applied command's time (unix ms): the state's clock.
func (f *FSM) Now() int64 {
	var now int64
	_ = f.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktMeta).Get(keyNow); len(v) == 8 {
			now = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	return now
}

// Nodes returns the node addresses recorded in the FSM (a copy the caller
// may change).
func (f *FSM) Nodes() map[string]command.NodeInfo { return maps.Clone(f.nodeAddrs()) }

// Node returns the addresses recorded for node id. Followers look the
// leader up on every request they forward: this answers from memory.
func (f *FSM) Node(id string) (command.NodeInfo, bool) {
	n, ok := f.nodeAddrs()[id]
	return n, ok
}

// nodesCache is the nodes bucket as read at generation gen.
type nodesCache struct {
	gen   uint64
	nodes map[string]command.NodeInfo // never changed once stored
}

// nodeAddrs returns the nodes bucket, read anew only when a batch that
// recorded addresses (or a restore) moved nodesGen since the cached read.
// The generation is loaded before the read and moves after the commit, so
// a read that missed a change is cached under an older generation than
// the current one and is not used again.
func (f *FSM) nodeAddrs() map[string]command.NodeInfo {
	gen := f.nodesGen.Load()
	if c := f.nodes.Load(); c != nil && c.gen == gen {
		return c.nodes
	}
	out := map[string]command.NodeInfo{}
	_ = f.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktNodes).ForEach(func(k, v []byte) error {
			d := mlog.Dec{B: v}
			n := command.NodeInfo{ID: string(k), HTTPAddr: d.Str(), RaftAddr: d.Str()}
			if d.Err() == nil {
				out[n.ID] = n
			}
			return nil
		})
	})
	f.nodes.Store(&nodesCache{gen: gen, nodes: out})
	return out
}

// Snapshot implements raft.FSM: it opens a read transaction, which bbolt
// keeps consistent while applies go on, and Persist streams it out.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.markSnapshot()                    // raft calls this between applies
	f.compactIfSparse(f.reclaim.Load()) // a safe point: compact.go
	f.mu.RLock()
	// The snapshot's index becomes a checkpoint: after an unclean stop,
	// raft replays from the latest snapshot, which fsm.db then covers.
	if err := f.takeCheckpoint(false); err != nil {
		f.logger.Warn("fsm.db checkpoint failed: after a stop other than a clean one, the state is rebuilt from the previous checkpoint or snapshot",
			"err", err)
	}
	tx, err := f.db.Begin(false)
	if err != nil {
		f.mu.RUnlock()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	release := f.held.hold(f.db) // a Restore does not wait for it (heldtx.go)
	f.mu.RUnlock()
	return &snapshot{tx: tx, release: release}, nil
}

type snapshot struct {
	tx      *bolt.Tx
	release func()
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.tx.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {
	_ = s.tx.Rollback()
	s.release()
}

// Restore implements raft.FSM: the snapshot is a whole bbolt file, which
// replaces the current database atomically: it is written to a temporary
// file, fsynced, and renamed over fsm.db (then the directory is fsynced).
// A crash before the rename leaves the old file, whose applied index is
// below the snapshot's, so the next start restores the snapshot again.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := f.path + ".restore"
	w, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if _, err := io.Copy(w, rc); err != nil {
		w.Close()
		return fmt.Errorf("restore copy: %w", err)
	}
	if err := w.Sync(); err != nil {
		w.Close()
		return fmt.Errorf("restore sync: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("restore close: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// The checkpoint is of the old file: durably none until the new one's.
	if err := f.dropCheckpoint(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// Not waiting for a snapshot raft is still taking of the old file: its
	// goroutine may be waiting for raft's main goroutine, which waits for
	// this Restore (heldtx.go).
	if err := f.held.retire(f.db); err != nil {
		return fmt.Errorf("restore: close old db: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("restore rename: %w", err)
	}
	if err := durable.SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	db, err := openDB(f.path)
	if err != nil {
		return err
	}
	f.db = db
	if err := f.takeCheckpoint(false); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	f.restores.Add(1)
	f.cfgGen.Add(1)
	f.nodesGen.Add(1)
	f.directoryChanged()
	f.markSnapshot()
	applied, _ := f.storedApplied()
	f.applied.Store(applied)
	if err := f.loadFormat(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if f.notify.Load() != nil {
		all := map[string]struct{}{}
		_ = db.View(func(tx *bolt.Tx) error {
			for _, t := range mlog.Topics(tx) {
				all[t] = struct{}{}
			}
			return nil
		})
		f.Wake(all)
	}
	return nil
}
