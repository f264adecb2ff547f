package raftfsm

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
)

// The leader raises the format only when every other member answered its
// probe lately and reads the new format.
func TestFormatRaise(t *testing.T) {
	members := []raft.Server{
		{ID: "n1", Suffrage: raft.Voter}, {ID: "n2", Suffrage: raft.Voter}, {ID: "n3", Suffrage: raft.Nonvoter},
	}
	good := formatProbe{max: 2, fresh: true}
	for _, c := range []struct {
		name    string
		cur     int
		members []raft.Server
		probes  map[string]formatProbe
		want    bool
	}{
		{"all good", 1, members, map[string]formatProbe{"n2": good, "n3": good}, true},
		{"single node", 1, members[:1], nil, true},
		{"already raised", 2, members, map[string]formatProbe{"n2": good, "n3": good}, false},
		{"member never probed", 1, members, map[string]formatProbe{"n2": good}, false},
		{"stale probe", 1, members, map[string]formatProbe{"n2": good, "n3": {max: 2}}, false},
		{"old binary answers 0", 1, members, map[string]formatProbe{"n2": {max: 0, fresh: true}, "n3": good}, false},
		{"non-voter on an old binary", 1, members, map[string]formatProbe{"n2": good, "n3": {max: 1, fresh: true}}, false},
		{"probes of non-members do not count", 1, members, map[string]formatProbe{"n2": good, "n4": good}, false},
	} {
		if got := formatRaise(c.cur, 2, "n1", c.members, c.probes); got != c.want {
			t.Errorf("%s: formatRaise = %v, want %v", c.name, got, c.want)
		}
	}
}

// A probe answer counts while it is fresh and the latest probe succeeded;
// a member's binary from before formats reports 0.
func TestFormatProbes(t *testing.T) {
	now := time.Now()
	n := &Node{}
	n.peers.views = map[string]*peerView{
		"fresh":  {status: Status{StateFormatMax: 2}, lastOK: now.Add(-probeEvery)},
		"stale":  {status: Status{StateFormatMax: 2}, lastOK: now.Add(-probeStale - time.Millisecond)},
		"failed": {status: Status{StateFormatMax: 2}, lastOK: now, failed: true},
		"old":    {status: Status{}, lastOK: now},
		"never":  {failed: true},
	}
	want := map[string]formatProbe{"fresh": {2, true, true}, "stale": {2, false, true}, "failed": {2, false, true},
		"old": {0, true, true}, "never": {0, false, false}}
	got := n.formatProbes(now)
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %+v, want %+v", id, got[id], w)
		}
	}
}

// A member whose latest answer, however old, says its binary reads less
// than the format wanted is named (placement does not wait for a raise
// that cannot come); self, members never heard from and non-members are
// not.
func TestOlderMember(t *testing.T) {
	members := []raft.Server{{ID: "n1"}, {ID: "n2"}, {ID: "n3", Suffrage: raft.Nonvoter}}
	for _, c := range []struct {
		name   string
		probes map[string]formatProbe
		want   string
	}{
		{"all read it", map[string]formatProbe{"n2": {4, true, true}, "n3": {4, false, true}}, ""},
		{"an old member", map[string]formatProbe{"n2": {4, true, true}, "n3": {3, true, true}}, "n3"},
		{"an old member, down since", map[string]formatProbe{"n2": {3, false, true}, "n3": {4, true, true}}, "n2"},
		{"a binary older than formats", map[string]formatProbe{"n2": {0, true, true}}, "n2"},
		{"never heard from", map[string]formatProbe{"n2": {0, false, false}}, ""},
		{"self and non-members", map[string]formatProbe{"n1": {0, true, true}, "n9": {0, true, true}}, ""},
	} {
		if got := olderMember(4, "n1", members, c.probes); got != c.want {
			t.Errorf("%s: olderMember = %q, want %q", c.name, got, c.want)
		}
	}
}

// After the raise, the leader names the members whose binary reads less
// than the state's format (an older binary on a member's data dir); in
// format 1 nobody lags, whatever it reports.
func TestFormatLagging(t *testing.T) {
	members := []raft.Server{{ID: "n1"}, {ID: "n2"}, {ID: "n3", Suffrage: raft.Nonvoter}, {ID: "n4"}}
	probes := map[string]formatProbe{
		"n1": {max: 0, fresh: true}, // self: never named
		"n2": {max: 2, fresh: true},
		"n3": {max: 0, fresh: true}, // an older binary
		"n4": {max: 0, fresh: false},
		"n5": {max: 0, fresh: true}, // not a member
	}
	if got := formatLagging(2, "n1", members, probes); !slices.Equal(got, []string{"n3"}) {
		t.Errorf("format 2: lagging %v, want [n3]", got)
	}
	if got := formatLagging(1, "n1", members, probes); len(got) != 0 {
		t.Errorf("format 1: lagging %v, want none", got)
	}
}

// A node joins a cluster in format 1 whatever it runs; in format 2 only
// if its status answers, as itself, that it reads format 2.
func TestJoinFormatCheck(t *testing.T) {
	info := command.NodeInfo{ID: "n4", HTTPAddr: "127.0.0.1:7004"}
	for _, c := range []struct {
		name string
		cur  int
		st   Status
		err  error
		want string // "" allowed, else a part of the refusal's message
	}{
		{"format 1, older binary", 1, Status{NodeInfo: info}, nil, ""},
		{"format 1, no answer", 1, Status{}, errors.New("connection refused"), ""},
		{"format 2, reads 2", 2, Status{NodeInfo: info, StateFormatMax: 2}, nil, ""},
		{"format 2, older binary", 2, Status{NodeInfo: info}, nil, "reads state formats up to 0"},
		{"format 2, no answer", 2, Status{}, errors.New("connection refused"), "did not say"},
		{"format 2, another node answers", 2, Status{NodeInfo: command.NodeInfo{ID: "n9"}, StateFormatMax: 2}, nil, "answers as"},
	} {
		err := joinFormatCheck(c.cur, info, c.st, c.err)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (!errors.Is(err, ErrFormatUnsupported) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want ErrFormatUnsupported saying %q", c.name, err, c.want)
		}
	}
}

func TestJoinIDCheck(t *testing.T) {
	servers := []raft.Server{{ID: "n1", Address: "h1:7071"}, {ID: "n2", Address: "h2:7071"}}
	live := map[string]string{"n1": "h1:7071"} // n2 does not answer
	liveFn := func(id string) (string, bool) { a, ok := live[id]; return a, ok }
	cases := []struct {
		name string
		info command.NodeInfo
		want error
	}{
		{"a new id", command.NodeInfo{ID: "n3", RaftAddr: "h3:7071"}, nil},
		{"a member rejoining at its address", command.NodeInfo{ID: "n1", RaftAddr: "h1:7071"}, nil},
		{"another node under a live member's id", command.NodeInfo{ID: "n1", RaftAddr: "h9:7071"}, ErrNodeIDInUse},
		{"a member that does not answer, re-addressed", command.NodeInfo{ID: "n2", RaftAddr: "h8:7071"}, nil},
	}
	for _, c := range cases {
		if err := joinIDCheck(servers, c.info, liveFn); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// The member itself, restarted on a new address: its answer names it.
	live["n1"] = "h7:7071"
	if err := joinIDCheck(servers, command.NodeInfo{ID: "n1", RaftAddr: "h7:7071"}, liveFn); err != nil {
		t.Errorf("member re-addressed and answering from its new address: %v", err)
	}
}

func TestRemoveCheck(t *testing.T) {
	one := []raft.Server{{ID: "solo", Suffrage: raft.Voter}}
	two := []raft.Server{{ID: "a", Suffrage: raft.Voter}, {ID: "b", Suffrage: raft.Nonvoter}}
	cases := []struct {
		servers []raft.Server
		id      string
		want    error
	}{
		{one, "solo", ErrLastVoter},
		{one, "other", ErrNodeNotFound},
		{two, "a", ErrLastVoter},
		{two, "b", nil},
		{append(two, raft.Server{ID: "c", Suffrage: raft.Voter}), "a", nil},
	}
	for _, c := range cases {
		if err := removeCheck(c.servers, c.id); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("remove %s from %v: %v, want %v", c.id, c.servers, err, c.want)
		}
	}
}
