package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/housekeep"
	"github.com/mqd/mqd/internal/durable"
)

// A Group is this node's replica of one replicated group: one raft
// instance with its log and stable stores, its snapshots, its state
// machine (fsm.FSM), the group commit and proposal path, the snapshot
// loop, the leader loop (barrier, serving, timing wheel, housekeeping),
// the hand-off of leadership at a graceful stop, the lost-log guard and
// its metrics (labelled raft_group). Its files live in its own directory
// (GroupDir). It is not a consumer group (package group).
//
// What belongs to the process and is shared by every group (the node id,
// peers and their probes, clocks, the disk guard, readiness, the data
// dir's lock, the raft listener) stays with the node, which opens its
// groups and reaches into them through GroupConfig's hooks.
type Group struct {
	cfg    GroupConfig
	logger *slog.Logger
	raft   *raft.Raft
	fsm    *fsm.FSM
	trans  *VoteGate // cfg.Transport, kept out of elections while lost is restricted
	stores *Stores
	snaps  *raft.FileSnapshotStore
	lost   *lostGuard // lostlog.go

	hadState bool
	batch    *Batcher
	sched    *scheduler
	keep     *housekeep.Keeper // the leader's housekeeping (lease sweeps, trims, dedup expiry, replays)
	serving  atomic.Bool       // leader with its FSM caught up (after the term's barrier)
	handoff  atomic.Bool       // graceful stop: leadership is being handed off (handoff.go)
	inflight atomic.Int64      // proposals between enter and leave
	metrics  *groupMetrics
	release  func() // the claim on cfg.Dir (claimDir)
	observed chan raft.Observation
	peerDown peerSet // peers this leader's heartbeats fail to reach
	// appliedTo: a commit index up to which every entry is known applied
	// (ready.go).
	appliedTo atomic.Uint64
	// start: the state's start point raft started from, if any
	// (startsnap.go); bg runs its log count, which bgStop ends.
	start  *startPoint
	bg     sync.WaitGroup
	bgStop context.CancelFunc
}

// DefaultGroup is the id of the group every node has had since the first
// release: it lives in the data dir itself, so existing data dirs open
// unchanged.
const DefaultGroup = "default"

// GroupLabel is the label that tells one group's series from another's
// on /metrics ("raft_group", not "group": the consumer-group series
// already use that one).
const GroupLabel = "raft_group"

// GroupConfig configures one group.
type GroupConfig struct {
	// ID names the group (ValidateGroupID); DefaultGroup for the node's
	// first one.
	ID string
	// NodeID is this node's raft server id in the group.
	NodeID string
	// Dir holds the group's files: fsm.db, raft.db, wal/ (or raft's log
	// in raft.db), snapshots/, lost-entries (GroupDir).
	Dir string
	// Transport is raft's transport for this group, made by the node; the
	// group wraps it in its VoteGate and closes it at Shutdown.
	Transport GatedTransport
	// LogStore is the raft log store for a new directory: LogStoreWAL or
	// LogStoreBolt (an existing one keeps its own); WALSegment the size
	// of raft-wal's segments.
	LogStore   string
	WALSegment int
	// Tuning.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// Now is the service clock the leader stamps commands with.
	Now    func() time.Time
	Logger *slog.Logger
	Hooks  Hooks
}

// Hooks are where the process takes part in a group's life; every one may
// be nil.
type Hooks struct {
	// CheckStores runs once the log and stable stores are open, before
	// the state machine or the snapshots are read (the node checks the
	// id its data dir records).
	CheckStores func(g *Group) error
	// Opened runs once the state machine is open, before raft starts (the
	// node's disk guard counts the next snapshot, its clock resumes from
	// the state's time).
	Opened func(g *Group) error
	// DiskLow reports whether the data dir's filesystem is under its
	// floor: fsm.db is compacted at start, and a snapshot taken to give
	// space back, only then.
	DiskLow func() bool
	// Gate runs when this replica has become leader and applied what
	// earlier terms committed; the group serves only if it answers true
	// (the node hands leadership off while its clock is off; first, it
	// also anchors its service clock to the state's time). Unfit is asked
	// every second while serving: true stops serving until Gate (first
	// false) answers true again.
	Gate  func(ctx context.Context, g *Group, first bool) bool
	Unfit func() bool
	// Lead runs once the group serves, for the term (ctx ends with it);
	// what it returns, if not nil, runs every second of the term (the
	// node records its address and raises the state format).
	Lead func(ctx context.Context, g *Group) (every func(ctx context.Context))
	// TransferTarget picks the voter to hand leadership to; false: raft's
	// own choice (the most up to date follower).
	TransferTarget func(servers []raft.Server) (raft.ServerID, raft.ServerAddress, bool)
}

// ValidateGroupID checks a group id: 1 to 64 bytes of lower-case letters,
// digits, - and _ (it names a directory and a label value).
func ValidateGroupID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("group id %q: 1 to 64 bytes", id)
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("group id %q: lower-case letters, digits, - and _ only", id)
		}
	}
	return nil
}

// GroupDir is group id's directory in dataDir: the data dir itself for
// DefaultGroup, groups/<id>/ for any other, made (and its directory
// entries fsynced) if it does not exist.
func GroupDir(dataDir, id string) (string, error) {
	if err := ValidateGroupID(id); err != nil {
		return "", err
	}
	if id == DefaultGroup {
		return dataDir, nil
	}
	groups := filepath.Join(dataDir, "groups")
	dir := filepath.Join(groups, id)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("group %s: %w", id, err)
	}
	for _, d := range []string{groups, dataDir} {
		if err := durable.SyncDir(d); err != nil {
			return "", fmt.Errorf("group %s: fsync %s: %w", id, d, err)
		}
	}
	return dir, nil
}

// HasGroupDir reports whether dataDir holds a directory for data group id
// (a replica of it, or what is left of one).
func HasGroupDir(dataDir, id string) bool {
	if ValidateGroupID(id) != nil || id == DefaultGroup {
		return false
	}
	st, err := os.Stat(filepath.Join(dataDir, "groups", id))
	return err == nil && st.IsDir()
}

func (c *GroupConfig) validate() error {
	if err := ValidateGroupID(c.ID); err != nil {
		return err
	}
	switch {
	case c.NodeID == "" || c.Dir == "" || c.Transport == nil:
		return errors.New("group: node id, directory and transport are required")
	case c.SnapshotInterval <= 0 || c.TrailingLogs == 0 || c.SnapshotThreshold == 0:
		return errors.New("group: snapshot interval, threshold and trailing logs are required")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ID != DefaultGroup {
		// Every line of a data group (its state file, snapshots, raft's
		// own, the lost-log guard) says which group it is about, as its
		// series on /metrics do; the default group's lines stay as they
		// were before groups.
		c.Logger = c.Logger.With(GroupLabel, c.ID)
	}
	return nil
}

// OpenGroup opens a group: raft log on raft-wal (or raft-boltdb), stable
// store in raft.db, file snapshots, the transport given, and the state
// machine as it was left (fsm.db), to which raft applies the log entries
// it does not hold yet. Run runs it; Shutdown stops it. On error, the
// transport is closed too.
func OpenGroup(cfg GroupConfig) (*Group, error) {
	if err := cfg.validate(); err != nil {
		if cfg.Transport != nil {
			cfg.Transport.Close()
		}
		return nil, err
	}
	release, err := claimDir(cfg.Dir, cfg.ID)
	if err != nil {
		cfg.Transport.Close()
		return nil, err
	}
	g := &Group{cfg: cfg, logger: cfg.Logger, metrics: newGroupMetrics(cfg.ID), release: release}
	if err := g.open(); err != nil {
		cfg.Transport.Close()
		g.closeStores()
		return nil, err
	}
	return g, nil
}

// openDirs are the directories of the groups open in this process, by
// absolute path: two groups in one directory would open the same files
// (another process is kept out by the node's lock on the data dir).
var openDirs sync.Map

// claimDir claims dir for group id until release is called.
func claimDir(dir, id string) (release func(), err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", id, err)
	}
	if other, taken := openDirs.LoadOrStore(abs, id); taken {
		return nil, fmt.Errorf("group %s: directory %s is group %s's, open in this process", id, abs, other)
	}
	var once sync.Once
	return func() { once.Do(func() { openDirs.Delete(abs) }) }, nil
}

func (g *Group) open() error {
	cfg := g.cfg
	var err error
	if g.lost, err = newLostGuard(cfg.Dir, g.metrics.lostFound, g.logger); err != nil {
		return err
	}
	g.batch = NewBatcher(g.propose, g.metrics.labels)
	hlog := NewHclog(g.logger, "raft") // raft logs through slog, quietly (hclog.go)
	if g.stores, err = OpenStores(cfg.Dir, cfg.LogStore, cfg.WALSegment, g.logger, hlog); err != nil {
		return err
	}
	if h := cfg.Hooks.CheckStores; h != nil {
		if err := h(g); err != nil {
			return err
		}
	}
	// Two snapshots: the latest and at most one older one (a snapshot is a
	// whole copy of fsm.db, streamed from a bbolt read transaction).
	if g.snaps, err = raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.Dir, "snapshots"), 2, hlog); err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	if err := g.openFSM(); err != nil {
		return err
	}
	if h := cfg.Hooks.Opened; h != nil {
		if err := h(g); err != nil {
			return err
		}
	}
	logs, err := g.openLog()
	if err != nil {
		return err
	}
	return g.startRaft(logs, hlog)
}

// openFSM opens the state machine and wires it to the group's metrics,
// timing wheel and housekeeping.
func (g *Group) openFSM() error {
	// What the log and snapshots can bring the state back to: OpenFSM
	// keeps a copy of a live tree that is ahead of it before it rolls the
	// file back to its checkpoint (fsm/evidence.go).
	backed, err := fsm.LogBacks(g.stores.Log, g.snaps)
	if err != nil {
		return err
	}
	sm, err := fsm.OpenFSMBacked(filepath.Join(g.cfg.Dir, "fsm.db"), g.logger, backed)
	if err != nil {
		return err
	}
	g.fsm = sm
	sm.CompactAtStart(g.cfg.Hooks.DiskLow != nil && g.cfg.Hooks.DiskLow()) // fsm/compact.go
	sm.OnRecovery(g.metrics.recovery)
	g.metrics.applied = sm.AppliedIndex
	sm.Tally = g.metrics.tally
	g.sched = newScheduler(g)
	g.keep = housekeep.New(keeperGroup{g}, g.cfg.NodeID, g.cfg.Now, g.logger)
	sm.ReplayQueued, sm.TopicsTouched = g.keep.ReplayQueued, g.keep.TopicsTouched
	return nil
}

// openLog marks what was applied before this start, checks the state
// against the log, and wraps the log store as raft sees it.
func (g *Group) openLog() (raft.LogStore, error) {
	sm := g.fsm
	// Entries this node applied before this start must not count on
	// /metrics again when raft replays them. A state machine opened as a
	// clean close left it holds all of them, and applies (and counts) only
	// what is newer. One rolled back to its checkpoint (kill -9, power
	// loss) had applied up to what its live tree recorded, or, when that
	// is not known, up to about the log's end: those replay uncounted (a
	// crash may under-count the entries it left unapplied, never count
	// one twice).
	last, err := g.stores.Log.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raft log store: %w", err)
	}
	applied, appliedTerm := sm.LostEvidence() // how far the state got before this start (fsm/lostlog.go)
	tallyFrom := max(last, applied)
	if sm.OpenedClean() {
		tallyFrom = sm.OpenedIndex()
	}
	sm.TallyFrom.Store(tallyFrom)
	// A small cache: an entry may carry a whole batch (up to 4 MiB), and
	// the cache only serves replication of the newest entries.
	// Raft writes the log through guardedLog, which refuses to replace
	// entries the state applied (guardlog.go).
	logs, err := raft.NewLogCache(64, guardedLog{LogStore: g.stores.Log, g: g})
	if err != nil {
		return nil, err
	}
	// The files just made or opened (raft.db, wal/, snapshots/) are named
	// by directory entries: fsynced before anything relies on them.
	if err := syncGroupDirs(g.cfg.Dir); err != nil {
		return nil, fmt.Errorf("data dir: fsync: %w", err)
	}
	// A state applied past what the log and snapshots hold: this node lost
	// entries; it stays out of elections until it has them again.
	if err := g.checkLostAtOpen(applied, appliedTerm, g.snaps); err != nil {
		return nil, err
	}
	return logs, nil
}

// raftCommitTimeout is how long an idle leader waits (up to twice this)
// before it sends each follower an AppendEntries without entries, which
// carries the commit index: raft's default. Idle, these are most of a
// group's RPCs, more than its heartbeats (docs/performance.md, Idle cost
// per raft group); BenchmarkIdleGroups measures a longer one beside it.
var raftCommitTimeout = 50 * time.Millisecond

func (g *Group) startRaft(logs raft.LogStore, hlog hclog.Logger) error {
	cfg := g.cfg
	g.trans = NewVoteGate(cfg.Transport, raft.ServerID(cfg.NodeID), g.lost.restricted, g.lost.diverged, g.logger)
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.BatchApplyCh = true
	// Entries per AppendEntries: 64 (raft's default; was 1024). Group
	// commit makes entries of at most 64 KiB, so a batch carries about
	// 4 MiB; only a single large command (up to 17 MiB) makes one larger.
	// With 1024, a follower catching up received and decoded up to 1024
	// batched entries of up to 4 MiB at once (2.0 GB RSS for 300 MB).
	rc.MaxAppendEntries = MaxAppendEntries
	rc.SnapshotThreshold = RaftSnapshotOff // snapshotLoop decides (snapshots.go)
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.HeartbeatTimeout = 1500 * time.Millisecond
	rc.ElectionTimeout = 1500 * time.Millisecond
	rc.LeaderLeaseTimeout = 1000 * time.Millisecond
	rc.CommitTimeout = raftCommitTimeout
	var err error
	if g.hadState, err = raft.HasExistingState(logs, g.stores.Stable, g.snaps); err != nil {
		return err
	}
	if rc.NoSnapshotRestoreOnStart, err = g.fsmCoversSnapshot(g.snaps); err != nil {
		return err
	}
	snaps := &stateSnapshots{SnapshotStore: g.snaps}
	if rc.NoSnapshotRestoreOnStart && g.hadState {
		if err := g.offerStartPoint(snaps); err != nil {
			return err
		}
	}
	installRaftSink()
	g.raft, err = raft.NewRaft(rc, g.fsm, logs, g.stores.Stable, snaps, g.trans)
	snaps.offering.Store(false) // raft lists snapshots at start only inside NewRaft
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	if p := snaps.point; p != nil {
		ctx, cancel := context.WithCancel(context.Background())
		g.bgStop = cancel
		g.bg.Add(1)
		go func() {
			defer g.bg.Done()
			g.countLogBeforeStart(ctx, p)
		}()
	}
	g.observed = make(chan raft.Observation, 64)
	g.raft.RegisterObserver(raft.NewObserver(g.observed, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	}))
	return nil
}

// fsmCoversSnapshot reports whether the state machine, as opened, already
// holds the latest snapshot, so raft need not restore it at start and
// replays only the log after it (ApplyBatch skips what the file holds).
// It does not when fsm.db started empty, or when a crash came between
// raft storing an installed snapshot and Restore replacing the file.
func (g *Group) fsmCoversSnapshot(snaps raft.SnapshotStore) (bool, error) {
	list, err := snaps.List()
	if err != nil {
		return false, fmt.Errorf("snapshot store: %w", err)
	}
	if len(list) > 0 && g.fsm.AppliedIndex() < list[0].Index {
		// raft restores one: set aside those that fail their CRC first.
		if err := SetAsideBadSnapshots(g.cfg.Dir, snaps, g.logger, g.fsm.RecordRecovery); err != nil {
			return false, err
		}
		if list, err = snaps.List(); err != nil {
			return false, fmt.Errorf("snapshot store: %w", err)
		}
	}
	if err := g.checkReplayable(list); err != nil {
		return false, err
	}
	if len(list) == 0 {
		return true, nil
	}
	covers := g.fsm.AppliedIndex() >= list[0].Index
	if !covers {
		g.logger.Info("restoring the latest snapshot at start", "snapshot_index", list[0].Index, "fsm_applied_index", g.fsm.AppliedIndex())
	}
	return covers, nil
}

// ErrStateBehindLog: at start, neither the state nor a snapshot reaches
// back to the first entry of the raft log.
var ErrStateBehindLog = errors.New("state behind the raft log")

// checkReplayable refuses to start when neither fsm.db nor a snapshot
// reaches back to where the raft log starts: raft would fail on the first
// entry it cannot read. The node then says what to do rather than panic.
func (g *Group) checkReplayable(list []*raft.SnapshotMeta) error {
	first, err := g.stores.Log.FirstIndex()
	if err != nil || first <= 1 {
		return err
	}
	from := g.fsm.AppliedIndex()
	if len(list) > 0 {
		from = max(from, list[0].Index)
	}
	if from+1 >= first {
		return nil
	}
	return fmt.Errorf("%w: the state (applied index %d) and the snapshots (newest usable at %d) do not reach the raft log, "+
		"which starts at %d: replace this node as docs/operations.md says (Replacing a dead node: remove it, "+
		"start it with an empty data dir and --join), so that it gets the leader's snapshot", ErrStateBehindLog, g.fsm.AppliedIndex(), from, first)
}

// syncGroupDirs fsyncs the group's directory, wal/ and the snapshot
// directories.
func syncGroupDirs(dir string) error {
	if err := SyncSnapshotDirs(dir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "wal")); err == nil {
		if err := durable.SyncDir(filepath.Join(dir, "wal")); err != nil {
			return err
		}
	}
	return durable.SyncDir(dir)
}

func (g *Group) closeStores() {
	if g.bgStop != nil {
		g.bgStop()
	}
	g.bg.Wait()
	if g.stores != nil {
		g.stores.Close()
	}
	if g.fsm != nil {
		g.fsm.Close()
	}
	if g.release != nil {
		g.release()
	}
}

// Shutdown hands leadership off if leader of more than one voter, then
// stops raft and closes the transport and the stores. The loops end with
// the context given to Run.
func (g *Group) Shutdown() error {
	if g.IsLeader() && !g.HandingOff() && len(g.raft.GetConfiguration().Configuration().Servers) > 1 {
		if err := g.TransferLeadership(); err != nil {
			g.logger.Warn("leadership transfer", "err", err)
		}
	}
	err := g.raft.Shutdown().Error()
	// raft's NetworkTransport.Close stops the listener only: the
	// connections it pooled to the peers stay open, and each keeps a
	// handler goroutine on the peer (BenchmarkIdleGroups counts them).
	if cs, ok := g.cfg.Transport.(interface{ CloseStreams() }); ok {
		cs.CloseStreams()
	}
	g.trans.Close()
	g.closeStores()
	return err
}

// ID is the group's id.
func (g *Group) ID() string { return g.cfg.ID }

// Dir is the group's directory.
func (g *Group) Dir() string { return g.cfg.Dir }

// FSM is the group's state machine.
func (g *Group) FSM() *fsm.FSM { return g.fsm }

// Raft is the group's raft instance, for tests; the node goes through the
// group's methods, and the HTTP layer never sees it.
func (g *Group) Raft() *raft.Raft { return g.raft }

// Stable is the group's stable store (raft.db); the node records its id in
// the default group's.
func (g *Group) Stable() raft.StableStore { return g.stores.Stable }

// LogStore is the kind of raft log store the group runs on.
func (g *Group) LogStore() string { return g.stores.Kind }

// HadState reports whether the group had raft state when it was opened
// (a new one is bootstrapped or joined).
func (g *Group) HadState() bool { return g.hadState }

// IsLeader reports whether this replica leads the group now.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// Serving reports whether this replica leads and has applied everything
// committed before its term, so that its state answers requests.
func (g *Group) Serving() bool { return g.IsLeader() && g.serving.Load() }

// LeaderTerm is the raft term this replica leads the group in (ok false:
// it does not lead). The term is read first: a replica that steps down
// meanwhile claims its old term, which the next leader's higher one
// overrides (raftfsm/leaders.go).
func (g *Group) LeaderTerm() (term uint64, ok bool) {
	term = g.raft.CurrentTerm()
	return term, g.IsLeader()
}

// LeaderID is the id of the group's leader, if one is known.
func (g *Group) LeaderID() (string, bool) {
	_, lid := g.raft.LeaderWithID()
	return string(lid), lid != ""
}

// StateName is this replica's raft state: leader, follower, candidate or
// shutdown.
func (g *Group) StateName() string {
	switch g.raft.State() {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	}
	return "shutdown"
}

// LastContactMs is, on a follower, the milliseconds since it last heard
// from the leader, -1 if it never did; 0 on the leader.
func (g *Group) LastContactMs() int64 {
	if g.IsLeader() {
		return 0
	}
	lc := g.raft.LastContact()
	if lc.IsZero() {
		return -1
	}
	return time.Since(lc).Milliseconds()
}

// Servers returns the raft configuration's servers.
func (g *Group) Servers() ([]raft.Server, error) {
	f := g.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}

// CommitIndex is the highest log index this replica knows committed.
func (g *Group) CommitIndex() uint64 { return g.raft.CommitIndex() }

// LastSnapshotIndex is the index of this replica's latest snapshot.
//
// Raft's own figure is the state's start point until it takes or installs
// a snapshot (startsnap.go): that is not a snapshot, and the one before it
// is returned instead.
func (g *Group) LastSnapshotIndex() uint64 {
	var idx uint64
	fmt.Sscan(g.raft.Stats()["last_snapshot_index"], &idx)
	if p := g.start; p != nil && idx == p.meta.Index {
		return p.real
	}
	return idx
}

// Bootstrap forms the group of the given voters; a group that has state
// already ignores it (nil).
func (g *Group) Bootstrap(servers []raft.Server) error {
	err := g.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	return err
}

// AddVoter adds server id at raft address addr as a voter (on the leader),
// waiting up to timeout for raft to accept the change.
func (g *Group) AddVoter(id, addr string, timeout time.Duration) error {
	return g.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeout).Error()
}

// RemoveServer takes server id out of the group's configuration (on the
// leader), waiting up to timeout for raft to accept the change.
func (g *Group) RemoveServer(id string, timeout time.Duration) error {
	return g.raft.RemoveServer(raft.ServerID(id), 0, timeout).Error()
}

// Apply proposes a command on the leader and waits for it to be committed
// on a majority and applied here, or for ctx to end.
func (g *Group) Apply(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.leave()
	if c.Op == command.OpLease {
		defer g.fsm.AwaitLease()()
	}
	f, err := g.propose(ctx, c.Encode())
	if err != nil {
		return nil, err
	}
	return Await(ctx, f)
}

// propose hands an encoded command to raft without waiting for it.
func (g *Group) propose(ctx context.Context, data []byte) (raft.ApplyFuture, error) {
	return Propose(ctx, g.raft, data)
}

// ApplyBatched is Apply for commands that may share a log entry with
// others (each is applied on its own; one's failure does not fail another).
// It encodes c before it waits: from then on c and the buffers it refers
// to are the caller's again, even if ApplyBatched returns early.
func (g *Group) ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	if !g.IsLeader() {
		return nil, ErrNotLeader
	}
	if err := g.enter(); err != nil {
		return nil, err
	}
	defer g.leave()
	if c.Op == command.OpLease {
		defer g.fsm.AwaitLease()()
	}
	// Encoded here, in the caller's goroutine: the many callers encode in
	// parallel rather than the batcher one after the other, and once this
	// returns nothing refers to the caller's buffers (a publish's value may
	// alias its request body).
	enc, buf := c.EncodePooled()
	return g.batch.Submit(ctx, enc, buf)
}

// ApplyBatchedAll is ApplyBatched of several commands (not leases) that
// go into one group commit together (Batcher.SubmitAll): none waits a
// round for another's entry. ctxs[i] bounds the wait for cs[i]'s result;
// the results and errors are in the order of cs. As with ApplyBatched,
// the commands are encoded before anything waits.
func (g *Group) ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error) {
	res, errs := make([]*fsm.Result, len(cs)), make([]error, len(cs))
	failAll := func(err error) ([]*fsm.Result, []error) {
		for i := range errs {
			errs[i] = err
		}
		return res, errs
	}
	if len(cs) == 0 {
		return res, errs
	}
	if !g.IsLeader() {
		return failAll(ErrNotLeader)
	}
	if err := g.enter(); err != nil {
		return failAll(err)
	}
	defer g.leave()
	encs, bufs := make([][]byte, len(cs)), make([]*[]byte, len(cs))
	latest := ctxs[0]
	for i, c := range cs {
		if c.Op == command.OpLease {
			panic("replica: ApplyBatchedAll of a lease") // a program error: leases go through ApplyBatched
		}
		encs[i], bufs[i] = c.EncodePooled()
		if d, ok := ctxs[i].Deadline(); ok {
			if ld, lok := latest.Deadline(); lok && d.After(ld) {
				latest = ctxs[i]
			}
		} else {
			latest = ctxs[i]
		}
	}
	qs, err := g.batch.SubmitAll(latest, encs, bufs)
	if err != nil {
		for i := range bufs {
			command.RecycleEnc(bufs[i])
		}
		return failAll(err)
	}
	for i, q := range qs {
		res[i], errs[i] = q.Wait(ctxs[i])
	}
	return res, errs
}
