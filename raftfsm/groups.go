package raftfsm

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/replica"
)

// Data groups (SPEC section 12, docs/ARCHITECTURE.md "Several Raft
// groups"). The default group is also the metadata group: its state's
// directory (fsm/directory.go) records each data group's members and the
// topics placed in it. A node opens every data group the directory names
// it a member of, in groups/<id>/ of its data dir, on the node's one raft
// port; a group it opens for the first time is bootstrapped with the
// recorded members (every member bootstraps the same configuration, which
// raft allows), and one that has state resumes from it.

// dataGroups are the data groups this node holds a replica of.
type dataGroups struct {
	mu     sync.Mutex
	open   map[string]*replica.Group
	failed map[string]string // group → why it could not be opened (logged once)
	ctx    context.Context   // Run's, once it runs: groups opened later run under it
	wg     sync.WaitGroup    // the groups' Run
	wake   chan struct{}     // the directory or the nodes changed
	closed bool
	opened []func(*replica.Group) // OnDataGroup's functions
}

// OnDataGroup calls fn with every data group this node holds and, from
// then on, with each one it opens (the HTTP layer registers the group's
// metrics). fn must not block.
func (n *Node) OnDataGroup(fn func(g *replica.Group)) {
	n.data.mu.Lock()
	defer n.data.mu.Unlock()
	n.data.opened = append(n.data.opened, fn)
	for _, g := range n.data.open {
		fn(g)
	}
}

// Group is the data group id this node holds, or nil.
func (n *Node) Group(id string) *replica.Group {
	n.data.mu.Lock()
	defer n.data.mu.Unlock()
	return n.data.open[id]
}

// DataGroups are the data groups this node holds, by id.
func (n *Node) DataGroups() map[string]*replica.Group {
	n.data.mu.Lock()
	defer n.data.mu.Unlock()
	out := make(map[string]*replica.Group, len(n.data.open))
	for id, g := range n.data.open {
		out[id] = g
	}
	return out
}

// Directory is the metadata group's directory as this node applied it.
func (n *Node) Directory() *fsm.Directory { return n.FSM.Directory() }

// wakeGroups asks the group loop to open what the directory names.
func (n *Node) wakeGroups() {
	select {
	case n.data.wake <- struct{}{}:
	default:
	}
}

// groupLoop opens the data groups the directory names this node a member
// of, at start and whenever the directory changes, until ctx ends.
func (n *Node) groupLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second) // a member's address may arrive after its group
	defer t.Stop()
	for {
		n.openDataGroups(ctx)
		select {
		case <-ctx.Done():
			return
		case <-n.data.wake:
		case <-t.C:
		}
	}
}

// openDataGroups opens, bootstraps if new, and runs each data group the
// directory names this node a member of that it does not hold yet.
func (n *Node) openDataGroups(ctx context.Context) {
	dir := n.FSM.Directory()
	ids := make([]string, 0, len(dir.Groups))
	for id := range dir.Groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	current := -1 // whether dir is the cluster's latest (asked once, when needed)
	for _, id := range ids {
		members := dir.Groups[id]
		if g := n.Group(id); g != nil {
			if !slices.Contains(members, n.cfg.ID) {
				n.leaveDataGroup(g) // moves.go
			}
			continue
		}
		member := slices.Contains(members, n.cfg.ID)
		if !member && !replica.HasGroupDir(n.cfg.DataDir, id) {
			continue
		}
		// A replica the directory no longer names but whose files are
		// here was moved off this node while it was down (the group's
		// leader removed it without it): it is opened, never
		// bootstrapped, so that leaveDataGroup (moves.go) deletes it once
		// its data is not needed, rather than left on disk for good (and
		// resumed, stale, if a later move brings the group back here).
		// Only once this node has applied what the cluster committed: a
		// directory read from a state file older than a move of the
		// group onto this node would not name it either.
		if !member {
			if current < 0 {
				current = 0
				if v := n.Ready(ctx); v.Ready || v.CaughtUp {
					current = 1
				}
			}
			if current == 0 {
				continue // the next pass asks again
			}
			dir = n.FSM.Directory() // as applied now
			members = dir.Groups[id]
			member = slices.Contains(members, n.cfg.ID)
		}
		if err := n.openDataGroup(ctx, id, members, member && !dir.Moved[id]); err != nil {
			n.data.mu.Lock()
			first := n.data.failed[id] != err.Error()
			n.data.failed[id] = err.Error()
			n.data.mu.Unlock()
			if first {
				n.logger.Warn("open data group", "group", id, "err", err)
			}
		}
	}
}

// openDataGroup opens data group id; one without state is bootstrapped
// with members when bootstrap (the group never moved: every first member
// bootstraps the same configuration), else it waits for the group's leader
// to add it.
func (n *Node) openDataGroup(ctx context.Context, id string, members []string, bootstrap bool) error {
	nodes := n.FSM.Nodes()
	servers := make([]raft.Server, 0, len(members))
	for _, m := range members {
		info, ok := nodes[m]
		if !ok || info.RaftAddr == "" {
			return fmt.Errorf("member %s: raft address not recorded yet", m)
		}
		servers = append(servers, raft.Server{ID: raft.ServerID(m), Address: raft.ServerAddress(info.RaftAddr), Suffrage: raft.Voter})
	}
	n.data.mu.Lock()
	defer n.data.mu.Unlock()
	if n.data.closed || ctx.Err() != nil {
		return nil
	}
	g, err := n.openGroup(id)
	if err != nil {
		return err
	}
	if !g.HadState() && bootstrap {
		if err := g.Bootstrap(servers); err != nil {
			_ = g.Shutdown()
			return fmt.Errorf("bootstrap: %w", err)
		}
	}
	n.data.open[id] = g
	delete(n.data.failed, id)
	for _, fn := range n.data.opened {
		fn(g)
	}
	n.data.wg.Add(1)
	go func() {
		defer n.data.wg.Done()
		g.Run(ctx)
	}()
	n.logger.Info("data group opened", "group", id, "members", members, "new", !g.HadState())
	return nil
}

// shutdownDataGroups stops every data group (a leader hands leadership
// off first) and waits for their Run to return.
func (n *Node) shutdownDataGroups() error {
	n.data.mu.Lock()
	n.data.closed = true
	open := n.data.open
	n.data.open = map[string]*replica.Group{}
	n.data.mu.Unlock()
	var first error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for id, g := range open {
		n.disk.untrack(id) // its state file closes
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Shutdown(); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("data group %s: %w", id, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// dataLead is a data group's leader's work: raise the group's state
// format to the metadata group's (every member reads it: the directory
// exists only from format 4), and hand leadership to the member the
// directory names first when it is up, so that the leaders of a node's
// groups spread over the nodes.
func (n *Node) dataLead(ctx context.Context, g *replica.Group) func(context.Context) {
	raise := func(ctx context.Context) {
		want := n.FSM.StateFormat()
		if g.FSM().StateFormat() >= want {
			return
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := g.Apply(actx, &command.Command{Op: command.OpSetFormat, Now: Now().UnixMilli(), Format: uint32(want)}); err != nil {
			n.logger.Warn("raise data group's state format", "group", g.ID(), "format", want, "err", err)
		}
	}
	raise(ctx)
	var tried time.Time
	return func(ctx context.Context) {
		raise(ctx)
		if n.converge(ctx, g) { // moves.go: a move is under way
			return
		}
		members := n.FSM.Directory().Groups[g.ID()]
		if len(members) == 0 || members[0] == n.cfg.ID || time.Since(tried) < 5*time.Second {
			return
		}
		pref := members[0]
		if !n.peerFit(pref) {
			return
		}
		addr, ok := n.FSM.Node(pref)
		if !ok {
			return
		}
		tried = time.Now()
		if err := g.Raft().LeadershipTransferToServer(raft.ServerID(pref), raft.ServerAddress(addr.RaftAddr)).Error(); err != nil {
			n.logger.Info("hand data group to its preferred leader", "group", g.ID(), "to", pref, "err", err)
		}
	}
}

// peerFit reports whether member id answered its latest probe recently,
// is not stopping and its clock is within the bound (what transferTarget
// asks of a hand-off target).
func (n *Node) peerFit(id string) bool {
	cluster := n.Clock().Offset.Milliseconds()
	max := n.cfg.MaxClockOffset.Milliseconds()
	n.peers.mu.Lock()
	defer n.peers.mu.Unlock()
	v := n.peers.views[id]
	if v == nil || v.failed || time.Since(v.lastOK) > probeStale || v.status.Stopping {
		return false
	}
	d := cluster - v.offsetMs
	return d >= -max && d <= max
}

// TopicGroup is the data group topic is placed in, or "" (the default
// group) for a topic the directory does not name.
func (n *Node) TopicGroup(topic string) string { return n.FSM.Directory().GroupOf(topic) }

// GroupMembers are data group id's members as the directory records them.
func (n *Node) GroupMembers(id string) []string { return n.FSM.Directory().Groups[id] }

// HeldGroup is the view of data group id, if this node holds a replica.
func (n *Node) HeldGroup(id string) (*GroupView, bool) {
	g := n.Group(id)
	if g == nil {
		return nil, false
	}
	return n.View(g), true
}
