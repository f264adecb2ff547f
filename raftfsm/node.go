package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
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

// Node is one mqd process: what it shares between its replicated groups
// (its id and addresses, the data dir's lock, the raft listener, peers and
// their probes, clocks, the disk guard, readiness) and the groups it holds
// (replica.Group). Today it holds one, the default group, whose files are
// the data dir's own; the node's membership, proposals and readiness are
// that group's.
type Node struct {
	cfg Config
	// def is the default group (replica.DefaultGroup), in the data dir.
	def *replica.Group
	// FSM is the default group's state machine.
	FSM        *fsm.FSM
	data       dataGroups   // the data groups this node holds (groups.go)
	dirLock    *dirLock     // held from Open to Shutdown
	mux        *raftmux.Mux // the node's raft port, shared by its groups (transport.go)
	disk       *diskGuard
	clock      *clock
	clockStart startClock // timeline.go
	peers      peers
	leaders    leaderTable  // every data group's leader, from the probe answers (leaders.go)
	lowMember  atomic.Value // string: a member whose latest probe answer says disk_low, or "" (for its log lines)
	memberDisk memberMargin // the least margin over its floor a member reported (disk.go)
	joinPeers  atomic.Value // []string: Form's --join addresses, for clock probes
	ready      readiness    // ready.go
	idRecorded atomic.Bool  // the data dir records this node's id (nodeid.go)
	idWarned   atomic.Bool  // recording it failed and was logged once
	logger     *slog.Logger
}

// Open starts a node: it locks the data dir, makes the raft transport and
// opens the default group in the data dir (replica.OpenGroup: raft log on
// raft-wal or raft-boltdb, stable store in raft.db, file snapshots, and
// the FSM as it was left in fsm.db).
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
	n := &Node{cfg: cfg, logger: cfg.Logger, dirLock: lock}
	n.data = dataGroups{open: map[string]*replica.Group{}, failed: map[string]string{}, wake: make(chan struct{}, 1)}
	n.ready.hc = n.peerClient(readyAsk)
	n.disk = newDiskGuard(cfg.DataDir, cfg.MinFreeDisk, cfg.Logger)
	if n.clock, err = newClock(); err != nil {
		lock.release()
		return nil, err
	}
	if n.def, err = n.openGroup(replica.DefaultGroup); err != nil {
		n.closeMux()
		lock.release()
		return nil, err
	}
	n.FSM = n.def.FSM()
	n.FSM.OnDirectory(n.wakeGroups)
	return n, nil
}

// openGroup opens group id in its directory (replica.GroupDir) on a
// transport of its own, with the node's hooks.
func (n *Node) openGroup(id string) (*replica.Group, error) {
	dir, err := replica.GroupDir(n.cfg.DataDir, id)
	if err != nil {
		return nil, err
	}
	trans, err := n.groupTransport(id)
	if err != nil {
		return nil, err
	}
	return replica.OpenGroup(replica.GroupConfig{
		ID: id, NodeID: n.cfg.ID, Dir: dir, Transport: trans,
		LogStore: n.cfg.RaftLog, WALSegment: walSegmentSize(n.cfg.DataDir),
		SnapshotThreshold: n.cfg.SnapshotThreshold, SnapshotInterval: n.cfg.SnapshotInterval, TrailingLogs: n.cfg.TrailingLogs,
		Now: Now, Logger: n.cfg.Logger, Hooks: n.groupHooks(id),
	})
}

// groupTransport is raft's transport for group id on the node's one raft
// port (internal/raftmux, opened with the first group): the default group's
// connections are untagged, as nodes of the previous release expect.
func (n *Node) groupTransport(id string) (replica.GatedTransport, error) {
	if n.mux == nil {
		adv, err := net.ResolveTCPAddr("tcp", n.cfg.RaftAdvertise)
		if err != nil {
			return nil, fmt.Errorf("raft advertise address: %w", err)
		}
		if n.mux, err = openMux(n.cfg, adv); err != nil {
			return nil, fmt.Errorf("raft transport: %w", err)
		}
	}
	logger := n.cfg.Logger
	if id != replica.DefaultGroup {
		logger = logger.With(replica.GroupLabel, id) // as the group's own lines (replica.GroupConfig)
	}
	trans, err := n.mux.Transport(muxGroup(id), replica.NewHclog(logger, "raft"))
	if err != nil {
		return nil, fmt.Errorf("raft transport: %w", err)
	}
	return trans, nil
}

// groupHooks are the node's part in a group's life: the data dir's
// recorded id (the default group's stable store holds it), the disk
// guard, the clock gate, recording this node's address, the state format,
// and the choice of a hand-off target.
func (n *Node) groupHooks(id string) replica.Hooks {
	h := replica.Hooks{
		DiskLow: func() bool { return n.disk.isLow(0) },
		Gate: func(ctx context.Context, g *replica.Group, first bool) bool {
			if !n.clockGate(ctx, g) {
				return false
			}
			if first {
				st := n.Clock()
				n.anchorServiceClock(!st.Solo && st.Known && !st.Bad)
			}
			return true
		},
		Unfit:          func() bool { return n.Clock().Bad },
		TransferTarget: n.transferTarget,
	}
	track := func(g *replica.Group) {
		var seg uint64
		if g.LogStore() == replica.LogStoreWAL {
			seg = uint64(walSegmentSize(n.cfg.DataDir)) // raft-wal preallocates each segment whole
		}
		n.disk.track(id, g.FSM().NextSnapshotSize, seg) // disk.go; compact.go
	}
	if id != replica.DefaultGroup {
		h.Lead = n.dataLead
		h.Opened = func(g *replica.Group) error { track(g); return nil }
		return h
	}
	h.CheckStores = func(g *replica.Group) error { return n.checkID(g.Stable()) }
	h.Opened = func(g *replica.Group) error {
		track(g)
		n.checkClockAtStart(g.FSM().Now()) // before anything records the clock again
		return nil
	}
	h.Lead = func(ctx context.Context, _ *replica.Group) func(context.Context) {
		if err := n.Join(ctx, n.Info()); err != nil {
			n.logger.Warn("record own address", "err", err)
		}
		warned := map[string]bool{} // members named as unable to read the state format
		n.checkFormat(ctx, warned)  // a single node raises it at once; others once the probes answer
		return func(ctx context.Context) {
			n.checkFormat(ctx, warned)
			n.growGroups(ctx) // moves.go
		}
	}
	return h
}

// Default is the node's default group.
func (n *Node) Default() *replica.Group { return n.def }

// ID is this node's id.
func (n *Node) ID() string { return n.cfg.ID }

// Info is this node's addresses.
func (n *Node) Info() command.NodeInfo {
	return command.NodeInfo{ID: n.cfg.ID, HTTPAddr: n.cfg.HTTPAddr, RaftAddr: n.cfg.RaftAdvertise}
}

// IsLeader reports whether this node leads the default group now.
func (n *Node) IsLeader() bool { return n.def.IsLeader() }

// Serving reports whether this node leads and has applied everything
// committed before its term, so that its state answers requests.
func (n *Node) Serving() bool { return n.def.Serving() }

// Leader returns the default group's leader's id and HTTP address, if
// known (the address from the nodes the state records).
func (n *Node) Leader() (id, httpAddr string, ok bool) {
	lid, ok := n.def.LeaderID()
	if !ok {
		return "", "", false
	}
	if lid == n.cfg.ID {
		return n.cfg.ID, n.cfg.HTTPAddr, true
	}
	info, ok := n.FSM.Node(lid)
	return lid, info.HTTPAddr, ok && info.HTTPAddr != ""
}

// Apply proposes a command on the leader and waits for it to be committed
// on a majority and applied here, or for ctx to end.
func (n *Node) Apply(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return n.def.Apply(ctx, c)
}

// ApplyBatched is Apply through group commit (replica.Group.ApplyBatched).
func (n *Node) ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return n.def.ApplyBatched(ctx, c)
}

// ApplyBatchedAll is ApplyBatched of several commands committed together
// (replica.Group.ApplyBatchedAll).
func (n *Node) ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error) {
	return n.def.ApplyBatchedAll(ctxs, cs)
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

// Run runs the node until ctx ends: the peer probes, the clock record and
// its groups (replica.Group.Run).
func (n *Node) Run(ctx context.Context) {
	go n.probeLoop(ctx)
	go n.recordClockLoop(ctx.Done())
	go n.groupLoop(ctx)
	n.def.Run(ctx)
}

// Shutdown stops the groups (a leader hands leadership off first), records
// the clock and releases the data dir. The loops end with the context
// given to Run.
func (n *Node) Shutdown() error {
	err := n.shutdownDataGroups()
	n.disk.untrack(replica.DefaultGroup)
	if e := n.def.Shutdown(); e != nil {
		err = e
	}
	n.closeMux() // after every group: they share the port
	n.recordClock()
	n.closeReady()
	n.dirLock.release()
	return err
}

// HandingOff reports whether this node is handing leadership off.
func (n *Node) HandingOff() bool { return n.def.HandingOff() }

// HandOff hands leadership of the default group to another voter, if this
// node leads a cluster of more than one; it returns once another node
// leads (and its address is known), or when ctx ends. From then on this
// node proposes nothing.
func (n *Node) HandOff(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range n.DataGroups() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.HandOff(ctx, nil)
		}()
	}
	n.def.HandOff(ctx, func() (string, bool) {
		id, _, ok := n.Leader()
		return id, ok
	})
	wg.Wait()
}

// Bootstrap forms a new cluster of the given servers.
func (n *Node) Bootstrap(servers []command.NodeInfo) error {
	var cfg []raft.Server
	for _, s := range servers {
		cfg = append(cfg, raft.Server{ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.RaftAddr), Suffrage: raft.Voter})
	}
	err := n.def.Bootstrap(cfg)
	if err == nil {
		n.recordID(cfg)
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
	servers, err := n.Servers()
	if err != nil {
		return err
	}
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
		if err := n.def.AddVoter(info.ID, info.RaftAddr, 10*time.Second); err != nil {
			return fmt.Errorf("add voter %s: %w", info.ID, err)
		}
	}
	if n.FSM.Nodes()[info.ID] == info {
		return nil
	}
	_, err = n.Apply(ctx, &command.Command{Op: command.OpSetNode, Now: Now().UnixMilli(), Node: info})
	return err
}

// Servers returns the default group's raft configuration's servers.
func (n *Node) Servers() ([]raft.Server, error) { return n.def.Servers() }

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
func (n *Node) LastSnapshotIndex() uint64 { return n.def.LastSnapshotIndex() }

// CommitIndex is the highest log index this node knows committed.
func (n *Node) CommitIndex() uint64 { return n.def.CommitIndex() }
