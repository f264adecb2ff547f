package raftfsm

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/replica"
)

// DefaultReplicas is the number of replicas of a topic placed in a data
// group (SPEC section 12), or every node when the cluster has fewer.
const DefaultReplicas = 3

// formatWait bounds PlaceTopic's wait for the state format that data
// groups need.
const formatWait = 3 * time.Second

// PlaceTopic places a new topic in a data group, on the metadata leader
// (this node must lead the default group): it answers the group the topic
// is in, creating the group first when the placement needs a new one.
// A topic placed already keeps its group. Topics the default group holds
// (every topic of a cluster made before data groups) are not placed: the
// caller checks that first.
//
// It answers "" (the default group, where the caller creates the topic as
// a binary without data groups would, rather than refuse it) while the
// state format is below 4 (fsm.DirectoryFormat: a member runs such a
// binary, as in a rolling upgrade), and for a topic the default group
// created meanwhile (fsm's applyPlaceTopic).
//
// replicas is the topic's replica count (1, 3 or 5; every voter when the
// cluster has fewer).
func (n *Node) PlaceTopic(ctx context.Context, topic string, replicas int) (string, error) {
	if !n.IsLeader() {
		return "", replica.ErrNotLeader
	}
	dir := n.FSM.Directory()
	if g := dir.GroupOf(topic); g != "" {
		return g, nil
	}
	servers, err := n.Servers()
	if err != nil {
		return "", err
	}
	if ok, err := n.directoryFormat(ctx, servers); !ok {
		return "", err
	}
	dir = n.FSM.Directory()
	var voters []string
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		}
	}
	id, members, create := choosePlacement(voters, replicas, dir)
	if create {
		c := &command.Command{Op: command.OpCreateGroup, Now: Now().UnixMilli(), Group: id, Members: members, Replicas: replicas}
		if _, err := n.Apply(ctx, c); err != nil {
			return "", fmt.Errorf("create data group %s: %w", id, err)
		}
	}
	res, err := n.Apply(ctx, &command.Command{Op: command.OpPlaceTopic, Now: Now().UnixMilli(), Topic: topic, Group: id})
	if err != nil {
		return "", fmt.Errorf("place topic %s: %w", topic, err)
	}
	return res.Group, nil
}

// directoryFormat reports whether the state is in a format with the
// directory of data groups. A new cluster's leader raises the format
// within about a second of leading (formatraise.go): it waits for that up
// to formatWait, but not while a member is known to run a binary that
// reads less (members), for whom the raise cannot come.
func (n *Node) directoryFormat(ctx context.Context, members []raft.Server) (bool, error) {
	for wait := time.Now().Add(formatWait); n.FSM.StateFormat() < fsm.DirectoryFormat; {
		if time.Now().After(wait) || olderMember(fsm.DirectoryFormat, n.cfg.ID, members, n.formatProbes(time.Now())) != "" {
			return false, nil
		}
		if replica.Pause(ctx, 20*time.Millisecond) != nil {
			return false, fmt.Errorf("%w (it is %d; data groups need %d): the request's deadline passed waiting for it",
				fsm.ErrFormatTooOld, n.FSM.StateFormat(), fsm.DirectoryFormat)
		}
	}
	return true, nil
}

// choosePlacement picks the data group of a new topic among the replica
// sets {v[i], v[i+1], …, v[i+r−1]} (mod the sorted voters, the first the
// one to lead), so at most one group per voter and replica count exists,
// each preferring another leader, whatever the number of topics. Of those
// sets it takes, in this order: the one whose first member leads the
// fewest placed topics (leaders spread), then the one whose busiest member
// would hold the fewest, then the fewest held by its members in all (the
// replicas spread: on five nodes, three topics of three replicas hold two
// topics on the busiest node rather than three), then the set whose group
// holds the fewest topics (a set without a group holds none), then the
// lowest i. With fewer voters than r the sets are every voter, and the
// group is one created for r replicas (Directory.WantOf), which grows as
// voters join (growGroups, moves.go). It answers the group's id, its
// members, and whether it must be created.
func choosePlacement(voters []string, r int, dir *fsm.Directory) (id string, members []string, create bool) {
	voters = slices.Sorted(slices.Values(voters))
	want := r
	r = min(r, len(voters))
	counts := dir.Counts()
	held, led := map[string]int{}, map[string]int{}
	for _, g := range dir.Topics {
		ms := dir.Groups[g]
		for _, m := range ms {
			held[m]++
		}
		if len(ms) > 0 {
			led[ms[0]]++
		}
	}
	var best []int // the score of the best set so far, compared in order
	var bestID string
	var bestMembers []string
	for i := range voters {
		set := make([]string, r)
		for j := range set {
			set[j] = voters[(i+j)%len(voters)]
		}
		gid := groupWithMembers(dir, set, want)
		busiest, sum := 0, 0
		for _, m := range set {
			busiest = max(busiest, held[m]+1)
			sum += held[m]
		}
		score := []int{led[set[0]], busiest, sum, counts[gid]} // counts[""] is 0
		if best == nil || slices.Compare(score, best) < 0 {
			best, bestID, bestMembers = score, gid, set
		}
	}
	if bestID != "" {
		return bestID, bestMembers, false
	}
	return nextGroupID(dir), bestMembers, true
}

// groupWithMembers is the data group whose members are set, in that
// order, and that should have want members, or "".
func groupWithMembers(dir *fsm.Directory, set []string, want int) string {
	for _, g := range sortedKeys(dir.Groups) {
		if slices.Equal(dir.Groups[g], set) && dir.WantOf(g) == want {
			return g
		}
	}
	return ""
}

// nextGroupID is "g" and one more than the highest number of a group
// named so.
func nextGroupID(dir *fsm.Directory) string {
	hi := 0
	for g := range dir.Groups {
		if k, err := strconv.Atoi(strings.TrimPrefix(g, "g")); err == nil && strings.HasPrefix(g, "g") && k > hi {
			hi = k
		}
	}
	return "g" + strconv.Itoa(hi+1)
}
