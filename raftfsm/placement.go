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
	// A new cluster's leader raises the format within about a second of
	// leading (formatraise.go): wait for it that long, not longer (a
	// member on an older binary keeps it down).
	for wait := time.Now().Add(formatWait); n.FSM.StateFormat() < fsm.DirectoryFormat; {
		if time.Now().After(wait) || replica.Pause(ctx, 20*time.Millisecond) != nil {
			return "", fmt.Errorf("%w (it is %d; data groups need %d)", fsm.ErrFormatTooOld, n.FSM.StateFormat(), fsm.DirectoryFormat)
		}
	}
	servers, err := n.Servers()
	if err != nil {
		return "", err
	}
	var voters []string
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		}
	}
	id, members, create := choosePlacement(voters, replicas, dir)
	if create {
		c := &command.Command{Op: command.OpCreateGroup, Now: Now().UnixMilli(), Group: id, Members: members}
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

// choosePlacement picks the data group of a new topic: of the replica sets
// {v[i], v[i+1], …, v[i+r−1]} (mod the sorted voters, the first the one
// to lead), the one whose group holds the fewest topics (a set without a
// group holds none; ties: the lowest i). So at most one group per voter
// and replica count exists, each preferring another leader, and topics
// spread evenly over them whatever their number. It answers the group's
// id, its members, and whether it must be created.
func choosePlacement(voters []string, r int, dir *fsm.Directory) (id string, members []string, create bool) {
	voters = slices.Sorted(slices.Values(voters))
	r = min(r, len(voters))
	counts := dir.Counts()
	best, bestCount := -1, 0
	var bestID string
	var bestMembers []string
	for i := range voters {
		set := make([]string, r)
		for j := range set {
			set[j] = voters[(i+j)%len(voters)]
		}
		gid := ""
		for g, ms := range dir.Groups {
			if slices.Equal(ms, set) {
				gid = g
				break
			}
		}
		c := counts[gid] // 0 for a set without a group
		if best < 0 || c < bestCount {
			best, bestCount, bestID, bestMembers = i, c, gid, set
		}
	}
	if bestID != "" {
		return bestID, bestMembers, false
	}
	return nextGroupID(dir), bestMembers, true
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
