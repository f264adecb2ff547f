package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/housekeep"
	"github.com/mqd/mqd/internal/durable"
	"github.com/mqd/mqd/internal/raftmux"
	"github.com/mqd/mqd/replica"
	"github.com/mqd/mqd/tlsconf"
)

// Config configures a node.
type Config struct {
	ID                string
	DataDir           string
	RaftAddr          string         // listen address
	RaftAdvertise     string         // address peers dial; defaults to RaftAddr
	HTTPAddr          string         // advertised to peers for forwarding
	NodeToken         string         // bearer token for node-to-node HTTP calls (join, status); may be empty
	TLS               *tlsconf.Store // mutual TLS for raft and node-to-node HTTP; nil: plain TCP
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	MinFreeDisk       MinFree // zero: the default (5 %, at most 1 GiB)
	// MaxClockOffset: further than this from a majority of the voters'
	// clocks, the node does not lead and is not ready (clock.go).
	MaxClockOffset time.Duration
	// AcceptClock: a single-node cluster leads even when its wall clock is
	// ahead of the one it recorded plus the time it was down (timeline.go).
	AcceptClock bool
	// RaftLog is the raft log store for a new data dir: LogStoreWAL
	// (default) or LogStoreBolt. An existing data dir keeps its own.
	RaftLog string
	Logger  *slog.Logger
}

// Validate checks the configuration and fills defaults.
func (c *Config) Validate() error {
	if c.DataDir == "" || c.RaftAddr == "" || c.HTTPAddr == "" {
		return errors.New("data dir, raft address and http address are required")
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftAddr
	}
	if c.ID == "" {
		c.ID = c.RaftAdvertise
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxClockOffset <= 0 {
		c.MaxClockOffset = DefaultMaxClockOffset
	}
	switch c.RaftLog {
	case "":
		c.RaftLog = replica.LogStoreWAL
	case replica.LogStoreWAL, replica.LogStoreBolt:
	default:
		return fmt.Errorf("raft log store %q: want %s or %s", c.RaftLog, replica.LogStoreWAL, replica.LogStoreBolt)
	}
	return nil
}

// Node is one Raft member with its FSM.
type Node struct {
	cfg        Config
	Raft       *raft.Raft
	FSM        *fsm.FSM
	trans      *replica.VoteGate // raft's TCP transport, kept out of elections while lost is restricted
	mux        *raftmux.Mux      // the node's raft port, shared by its groups (transport.go)
	stores     *replica.Stores
	lost       *lostGuard // lostlog.go
	dirLock    *dirLock   // held from Open to Shutdown
	disk       *diskGuard
	clock      *clock
	clockStart startClock // timeline.go
	peers      peers
	lowMember  atomic.Value // string: a member whose latest probe answer says disk_low, or ""
	memberDisk memberMargin // the least margin over its floor a member reported (disk.go)
	raftDown   sync.Map     // ids of the peers this leader's heartbeats fail to reach
	handoff    atomic.Bool  // graceful stop: leadership is being handed off (handoff.go)
	inflight   atomic.Int64 // proposals between enter and leave
	joinPeers  atomic.Value // []string: Form's --join addresses, for clock probes
	hadState   bool
	ready      readiness   // ready.go
	idRecorded atomic.Bool // the data dir records this node's id (nodeid.go)
	idWarned   atomic.Bool // recording it failed and was logged once
	logger     *slog.Logger
	batch      *replica.Batcher
	sched      *scheduler
	keep       *housekeep.Keeper // the leader's housekeeping (lease sweeps, trims, dedup expiry, replays)
	serving    atomic.Bool       // leader with its FSM caught up (after the term's barrier)
	snaps      *raft.FileSnapshotStore
	metrics    *nodeMetrics
	observed   chan raft.Observation
}

// Open starts a node: raft log on raft-wal (or raft-boltdb), stable store
// in raft.db, file snapshots, TCP transport, and the FSM as it was left
// (fsm.db), to which raft applies the log entries it does not hold yet.
func Open(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	_, existing, err := replica.DetectLogStore(cfg.DataDir)
	if err != nil || !existing {
		if err == nil {
			err = ValidateNodeID(cfg.ID) // a new node: before any file is made
		}
		if err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir) // before any other file of the dir
	if err != nil {
		return nil, err
	}
	if !existing {
		if err := checkStartSpace(cfg.DataDir, cfg.RaftLog); err != nil { // disk.go
			lock.release()
			return nil, err
		}
	}
	n := &Node{cfg: cfg, logger: cfg.Logger, dirLock: lock, metrics: newNodeMetrics()}
	n.ready.hc = n.peerClient(readyAsk)
	n.disk = newDiskGuard(cfg.DataDir, cfg.MinFreeDisk, cfg.Logger)
	if n.lost, err = newLostGuard(cfg.DataDir, cfg.Logger); err != nil {
		lock.release()
		return nil, err
	}
	if n.clock, err = newClock(); err != nil {
		lock.release()
		return nil, err
	}
	n.batch = replica.NewBatcher(n.propose)
	hlog := replica.NewHclog(cfg.Logger, "raft") // raft logs through slog, quietly (replica/hclog.go)
	n.stores, err = replica.OpenStores(cfg.DataDir, cfg.RaftLog, walSegmentSize(cfg.DataDir), cfg.Logger, hlog)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	if err := n.checkID(); err != nil {
		n.closeStores()
		return nil, err
	}
	// Two snapshots: the latest and at most one older one (a snapshot is a
	// whole copy of fsm.db, streamed from a bbolt read transaction).
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "snapshots"), 2, hlog)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	n.snaps = snaps
	// What the log and snapshots can bring the state back to: OpenFSM
	// keeps a copy of a live tree that is ahead of it before it rolls the
	// file back to its checkpoint (fsm/evidence.go).
	backed, err := fsm.LogBacks(n.stores.Log, snaps)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	sm, err := fsm.OpenFSMBacked(filepath.Join(cfg.DataDir, "fsm.db"), cfg.Logger, backed)
	if err != nil {
		n.closeStores()
		return nil, err
	}
	n.FSM = sm
	sm.CompactAtStart(n.disk.isLow(0))         // fsm/compact.go
	n.disk.countSnapshots(sm.NextSnapshotSize) // compact.go
	n.checkClockAtStart(sm.Now())              // before anything records the clock again
	sm.OnRecovery(n.metrics.recovery)
	n.metrics.applied = sm.AppliedIndex
	sm.Tally = n.metrics.tally
	n.sched = newScheduler(n)
	n.keep = housekeep.New(leaderGroup{n}, cfg.ID, Now, n.logger)
	n.FSM.ReplayQueued, n.FSM.TopicsTouched = n.keep.ReplayQueued, n.keep.TopicsTouched
	if n.stores.Kind == replica.LogStoreWAL {
		n.disk.reserve(uint64(walSegmentSize(cfg.DataDir))) // raft-wal preallocates each segment whole
	}
	// Entries up to the log's end were applied before this start: replaying
	// them must not count on /metrics again. A state machine opened as it
	// was skips what it holds, and applies (and counts) only what is newer.
	last, err := n.stores.Log.LastIndex()
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("raft log store: %w", err)
	}
	applied, appliedTerm := sm.LostEvidence() // how far the state got before this start (fsm/lostlog.go)
	if o := sm.OpenedIndex(); o > 0 {
		last = o
	}
	sm.TallyFrom.Store(last)
	// A small cache: an entry may carry a whole batch (up to 4 MiB), and
	// the cache only serves replication of the newest entries.
	// Raft writes the log through guardedLog, which refuses to replace
	// entries the state applied (guardlog.go).
	logs, err := raft.NewLogCache(64, guardedLog{LogStore: n.stores.Log, n: n})
	if err != nil {
		n.closeStores()
		return nil, err
	}
	// The files just made or opened (raft.db, wal/, snapshots/) are named
	// by directory entries: fsynced before anything relies on them.
	if err := syncDataDirs(cfg.DataDir); err != nil {
		n.closeStores()
		return nil, fmt.Errorf("data dir: fsync: %w", err)
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.RaftAdvertise)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("raft advertise address: %w", err)
	}
	// A state applied past what the log and snapshots hold: this node lost
	// entries; it stays out of elections until it has them again.
	if err := n.checkLostAtOpen(applied, appliedTerm, snaps); err != nil {
		n.closeStores()
		return nil, err
	}
	var nt *raft.NetworkTransport
	n.mux, nt, err = openTransport(cfg, adv, hlog)
	if err != nil {
		n.closeStores()
		return nil, fmt.Errorf("raft transport: %w", err)
	}
	n.trans = replica.NewVoteGate(nt, raft.ServerID(cfg.ID), n.lost.restricted, n.lost.diverged, cfg.Logger)
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog
	rc.BatchApplyCh = true
	// Entries per AppendEntries: 64 (raft's default; was 1024). Group
	// commit makes entries of at most 64 KiB, so a batch carries about
	// 4 MiB; only a single large command (up to 17 MiB) makes one larger.
	// With 1024, a follower catching up received and decoded up to 1024
	// batched entries of up to 4 MiB at once (2.0 GB RSS for 300 MB).
	rc.MaxAppendEntries = replica.MaxAppendEntries
	rc.SnapshotThreshold = replica.RaftSnapshotOff // snapshotLoop decides (snapshots.go)
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.HeartbeatTimeout = 1500 * time.Millisecond
	rc.ElectionTimeout = 1500 * time.Millisecond
	rc.LeaderLeaseTimeout = 1000 * time.Millisecond
	n.hadState, err = raft.HasExistingState(logs, n.stores.Stable, snaps)
	if err != nil {
		n.closeTransport()
		n.closeStores()
		return nil, err
	}
	rc.NoSnapshotRestoreOnStart, err = n.fsmCoversSnapshot(snaps)
	if err != nil {
		n.closeTransport()
		n.closeStores()
		return nil, err
	}
	installRaftSink()
	n.Raft, err = raft.NewRaft(rc, sm, logs, n.stores.Stable, snaps, n.trans)
	if err != nil {
		n.closeTransport()
		n.closeStores()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.observed = make(chan raft.Observation, 64)
	n.Raft.RegisterObserver(raft.NewObserver(n.observed, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	}))
	return n, nil
}

// fsmCoversSnapshot reports whether the state machine, as opened, already
// holds the latest snapshot, so raft need not restore it at start and
// replays only the log after it (ApplyBatch skips what the file holds).
// It does not when fsm.db started empty, or when a crash came between
// raft storing an installed snapshot and Restore replacing the file.
func (n *Node) fsmCoversSnapshot(snaps raft.SnapshotStore) (bool, error) {
	list, err := snaps.List()
	if err != nil {
		return false, fmt.Errorf("snapshot store: %w", err)
	}
	if len(list) > 0 && n.FSM.AppliedIndex() < list[0].Index {
		// raft restores one: set aside those that fail their CRC first.
		if err := replica.SetAsideBadSnapshots(n.cfg.DataDir, snaps, n.logger, n.FSM.RecordRecovery); err != nil {
			return false, err
		}
		if list, err = snaps.List(); err != nil {
			return false, fmt.Errorf("snapshot store: %w", err)
		}
	}
	if err := n.checkReplayable(list); err != nil {
		return false, err
	}
	if len(list) == 0 {
		return true, nil
	}
	covers := n.FSM.AppliedIndex() >= list[0].Index
	if !covers {
		n.logger.Info("restoring the latest snapshot at start", "snapshot_index", list[0].Index, "fsm_applied_index", n.FSM.AppliedIndex())
	}
	return covers, nil
}

// checkReplayable refuses to start when neither fsm.db nor a snapshot
// reaches back to where the raft log starts: raft would fail on the first
// entry it cannot read. The node then says what to do rather than panic.
func (n *Node) checkReplayable(list []*raft.SnapshotMeta) error {
	first, err := n.stores.Log.FirstIndex()
	if err != nil || first <= 1 {
		return err
	}
	from := n.FSM.AppliedIndex()
	if len(list) > 0 {
		from = max(from, list[0].Index)
	}
	if from+1 >= first {
		return nil
	}
	return fmt.Errorf("%w: the state (applied index %d) and the snapshots (newest usable at %d) do not reach the raft log, "+
		"which starts at %d: replace this node as docs/operations.md says (Replacing a dead node: remove it, "+
		"start it with an empty data dir and --join), so that it gets the leader's snapshot", ErrStateBehindLog, n.FSM.AppliedIndex(), from, first)
}

// syncDataDirs fsyncs the data dir, wal/ and the snapshot directories.
func syncDataDirs(dataDir string) error {
	if err := replica.SyncSnapshotDirs(dataDir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dataDir, "wal")); err == nil {
		if err := durable.SyncDir(filepath.Join(dataDir, "wal")); err != nil {
			return err
		}
	}
	return durable.SyncDir(dataDir)
}

func (n *Node) closeStores() {
	if n.stores != nil {
		n.stores.Close()
	}
	if n.FSM != nil {
		n.FSM.Close()
	}
	n.dirLock.release()
}

// ID is this node's id.
func (n *Node) ID() string { return n.cfg.ID }

// Info is this node's addresses.
func (n *Node) Info() command.NodeInfo {
	return command.NodeInfo{ID: n.cfg.ID, HTTPAddr: n.cfg.HTTPAddr, RaftAddr: n.cfg.RaftAdvertise}
}

// IsLeader reports whether this node is the leader now.
func (n *Node) IsLeader() bool { return n.Raft.State() == raft.Leader }

// Serving reports whether this node leads and has applied everything
// committed before its term, so that its state answers requests.
func (n *Node) Serving() bool { return n.IsLeader() && n.serving.Load() }

// Leader returns the leader's id and HTTP address, if known.
func (n *Node) Leader() (id, httpAddr string, ok bool) {
	_, lid := n.Raft.LeaderWithID()
	if lid == "" {
		return "", "", false
	}
	if string(lid) == n.cfg.ID {
		return n.cfg.ID, n.cfg.HTTPAddr, true
	}
	info, ok := n.FSM.Node(string(lid))
	return string(lid), info.HTTPAddr, ok && info.HTTPAddr != ""
}

// Apply proposes a command on the leader and waits for it to be committed
// on a majority and applied here, or for ctx to end.
func (n *Node) Apply(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	if err := n.enter(); err != nil {
		return nil, err
	}
	defer n.leave()
	if c.Op == command.OpLease {
		defer n.FSM.AwaitLease()()
	}
	f, err := n.propose(ctx, c.Encode())
	if err != nil {
		return nil, err
	}
	return replica.Await(ctx, f)
}

// propose hands an encoded command to raft without waiting for it.
func (n *Node) propose(ctx context.Context, data []byte) (raft.ApplyFuture, error) {
	return replica.Propose(ctx, n.Raft, data)
}

// WaitLeader waits until some node leads (true) or ctx ends (false).
func (n *Node) WaitLeader(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, _, ok := n.Leader(); ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// Shutdown hands leadership off if leader, then stops raft and closes the
// stores. The leader loops end with the context given to Run.
func (n *Node) Shutdown() error {
	if n.IsLeader() && !n.HandingOff() && len(n.Raft.GetConfiguration().Configuration().Servers) > 1 {
		if err := n.transferLeadership(); err != nil {
			n.logger.Warn("leadership transfer", "err", err)
		}
	}
	err := n.Raft.Shutdown().Error()
	n.recordClock()
	n.closeReady()
	n.closeTransport()
	n.closeStores()
	return err
}

// Bootstrap forms a new cluster of the given servers.
func (n *Node) Bootstrap(servers []command.NodeInfo) error {
	var cfg raft.Configuration
	for _, s := range servers {
		cfg.Servers = append(cfg.Servers, raft.Server{ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.RaftAddr), Suffrage: raft.Voter})
	}
	err := n.Raft.BootstrapCluster(cfg).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	if err == nil {
		n.recordID(cfg.Servers)
	}
	return err
}

// Join adds a node as a voter (on the leader) and records its addresses.
// A node not yet in the configuration is asked which state formats its
// binary reads first, and refused (ErrFormatUnsupported) if not the
// state's.
func (n *Node) Join(ctx context.Context, info command.NodeInfo) error {
	if !n.IsLeader() {
		return replica.ErrNotLeader
	}
	have := false
	cf := n.Raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return err
	}
	servers := cf.Configuration().Servers
	for _, s := range servers {
		if string(s.ID) == info.ID && string(s.Address) == info.RaftAddr {
			have = true
		}
	}
	if !have {
		live := func(id string) (string, bool) { return n.liveRaftAddr(ctx, id) }
		if err := joinIDCheck(servers, info, live); err != nil {
			return err
		}
		// A binary that does not read the state's format would misread
		// the snapshot it is about to be sent.
		if err := n.checkJoiner(ctx, info); err != nil {
			return err
		}
		if err := n.Raft.AddVoter(raft.ServerID(info.ID), raft.ServerAddress(info.RaftAddr), 0, 10*time.Second).Error(); err != nil {
			return fmt.Errorf("add voter %s: %w", info.ID, err)
		}
	}
	if n.FSM.Nodes()[info.ID] == info {
		return nil
	}
	_, err := n.Apply(ctx, &command.Command{Op: command.OpSetNode, Now: Now().UnixMilli(), Node: info})
	return err
}

// Servers returns the raft configuration's servers.
func (n *Node) Servers() ([]raft.Server, error) {
	f := n.Raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	return f.Configuration().Servers, nil
}

// IsMember reports whether id is in the raft configuration or recorded in
// the state.
func (n *Node) IsMember(id string) bool {
	if _, ok := n.FSM.Node(id); ok {
		return true
	}
	servers, err := n.Servers()
	return err == nil && slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == id })
}

// LastSnapshotIndex is the index of this node's latest snapshot.
func (n *Node) LastSnapshotIndex() uint64 {
	var idx uint64
	fmt.Sscan(n.Raft.Stats()["last_snapshot_index"], &idx)
	return idx
}

// CommitIndex is the highest log index this node knows committed.
func (n *Node) CommitIndex() uint64 { return n.Raft.CommitIndex() }

// ApplyBatched is Apply for commands that may share a log entry with
// others (each is applied on its own; one's failure does not fail another).
// It encodes c before it waits: from then on c and the buffers it refers
// to are the caller's again, even if ApplyBatched returns early.
func (n *Node) ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	if !n.IsLeader() {
		return nil, replica.ErrNotLeader
	}
	if err := n.enter(); err != nil {
		return nil, err
	}
	defer n.leave()
	if c.Op == command.OpLease {
		defer n.FSM.AwaitLease()()
	}
	// Encoded here, in the caller's goroutine: the many callers encode in
	// parallel rather than the batcher one after the other, and once this
	// returns nothing refers to the caller's buffers (a publish's value may
	// alias its request body).
	enc, buf := c.EncodePooled()
	return n.batch.Submit(ctx, enc, buf)
}
