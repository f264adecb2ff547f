package api

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/raftfsm"
	"github.com/prometheus/client_golang/prometheus"
)

// Node is what the HTTP layer asks of the process and of the replicated
// group it runs: proposals, leadership, readiness, membership and the
// node's resources. *raftfsm.Node is the one the server runs on.
type Node interface {
	ID() string
	Info() command.NodeInfo
	// Apply proposes a command and waits for its result; ApplyBatched
	// does so through group commit, and ApplyBatchedAll for several
	// commands that go into one group commit together (ctxs[i] bounds the
	// wait for cs[i]). CheckDisk refuses a write of size bytes when the
	// disk is under its floor.
	Apply(ctx context.Context, c *command.Command) (*fsm.Result, error)
	ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error)
	ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error)
	CheckDisk(size int) error

	IsLeader() bool
	Serving() bool
	Leader() (id, httpAddr string, ok bool)
	WaitLeader(ctx context.Context) bool
	HandingOff() bool
	LastContactMs() int64
	StateName() string
	Ready(ctx context.Context) raftfsm.Readiness
	Status() raftfsm.Status
	CommitIndex() uint64
	LastSnapshotIndex() uint64

	Servers() ([]raft.Server, error)
	IsMember(id string) bool
	Peer(id string) raftfsm.PeerState
	Join(ctx context.Context, info command.NodeInfo) error
	RemoveNode(ctx context.Context, id string) error

	Resources() raftfsm.Resources
	AcceptClock() (time.Duration, bool)
	Backup() (*fsm.Backup, error)
	Collectors() []prometheus.Collector
	GroupTallies() map[fsm.TopicGroup]raftfsm.TallyAt
	DropGroupTallies(keys []fsm.TopicGroup, upTo uint64)
}

// State is what the HTTP layer reads of the replicated state machine:
// typed reads in one read transaction, the topic configuration's
// generation, leased messages' bodies, node addresses, indexes, and the
// wake-up of long-polls. *fsm.FSM is the one the server runs on.
type State interface {
	Read(fn func(r *fsm.Reader) error) error
	ConfigGen() uint64
	FillLeased(topic string, ds []group.Delivery) ([]group.Delivery, error)
	Nodes() map[string]command.NodeInfo
	AppliedIndex() uint64
	StateFormat() int
	OnNotify(fn func(topics map[string]struct{}))
}

var (
	_ Node  = (*raftfsm.Node)(nil)
	_ State = (*fsm.FSM)(nil)
)
