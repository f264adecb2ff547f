package raftfsm

import (
	"context"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/replica"
)

// GroupView is the node as seen by the requests of one data group's
// topics: proposals, leadership, indexes and the group's raft
// configuration are the data group's; the node's identity, peers, disk,
// clock, readiness and membership stay the node's (api.Node).
type GroupView struct {
	*Node
	g *replica.Group
}

// View is the node as the requests of data group g see it.
func (n *Node) View(g *replica.Group) *GroupView { return &GroupView{Node: n, g: g} }

// CheckDisk is Node.CheckDisk for the group's members: only they store
// what its leader commits, so a node low on disk refuses the writes of the
// groups it holds a replica of and not the others'.
func (v *GroupView) CheckDisk(size int) error {
	members := v.GroupMembers(v.g.ID())
	return v.checkDisk(size, func(id string) bool { return slices.Contains(members, id) })
}

// Replica is the data group the view is of.
func (v *GroupView) Replica() *replica.Group { return v.g }

// IsLeader reports whether this node leads the data group.
func (v *GroupView) IsLeader() bool { return v.g.IsLeader() }

// Serving reports whether this node leads the data group and its state
// answers requests.
func (v *GroupView) Serving() bool { return v.g.Serving() }

// Leader returns the data group's leader's id and HTTP address, if known.
func (v *GroupView) Leader() (id, httpAddr string, ok bool) {
	lid, ok := v.g.LeaderID()
	if !ok {
		return "", "", false
	}
	if lid == v.cfg.ID {
		return v.cfg.ID, v.cfg.HTTPAddr, true
	}
	info, ok := v.FSM.Node(lid)
	return lid, info.HTTPAddr, ok && info.HTTPAddr != ""
}

// WaitLeader waits until some node leads the data group (true) or ctx
// ends (false).
func (v *GroupView) WaitLeader(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, _, ok := v.Leader(); ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// Apply proposes c in the data group.
func (v *GroupView) Apply(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return v.g.Apply(ctx, c)
}

// ApplyBatched proposes c in the data group through its group commit.
func (v *GroupView) ApplyBatched(ctx context.Context, c *command.Command) (*fsm.Result, error) {
	return v.g.ApplyBatched(ctx, c)
}

// ApplyBatchedAll proposes cs in the data group, committed together.
func (v *GroupView) ApplyBatchedAll(ctxs []context.Context, cs []*command.Command) ([]*fsm.Result, []error) {
	return v.g.ApplyBatchedAll(ctxs, cs)
}

// HandingOff reports whether this node is handing the data group's
// leadership off.
func (v *GroupView) HandingOff() bool { return v.g.HandingOff() }

// LastContactMs is the time since the data group's leader was last heard.
func (v *GroupView) LastContactMs() int64 { return v.g.LastContactMs() }

// StateName is this node's raft state in the data group.
func (v *GroupView) StateName() string { return v.g.StateName() }

// CommitIndex is the data group's highest index known committed here.
func (v *GroupView) CommitIndex() uint64 { return v.g.CommitIndex() }

// LastSnapshotIndex is the index of this node's latest snapshot of the
// data group.
func (v *GroupView) LastSnapshotIndex() uint64 { return v.g.LastSnapshotIndex() }

// Servers returns the data group's raft configuration's servers.
func (v *GroupView) Servers() ([]raft.Server, error) { return v.g.Servers() }

// GroupTallies are the data group's consumer group sums.
func (v *GroupView) GroupTallies() map[fsm.TopicGroup]TallyAt { return v.g.GroupTallies() }

// DropGroupTallies forgets sums of the data group's deleted consumer
// groups.
func (v *GroupView) DropGroupTallies(keys []fsm.TopicGroup, upTo uint64) {
	v.g.DropGroupTallies(keys, upTo)
}
