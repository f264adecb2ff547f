package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// The data-groups mode (Config.DataGroups; docs/reliability.md, "Several
// Raft groups"): five nodes started with --data-groups, the workload spread
// over several topics that placement puts in different data groups with
// leaders on different nodes, and faults aimed at that structure: the
// leader of one data group, the metadata group's (the default group's)
// leader, all of them at once, and a node killed while a drain or a
// rebalance moves replicas. The checker runs per topic, and the replicas
// are compared per group.

// dataNodes is the cluster size of the data-groups mode.
const dataNodes = 5

// dataTopics are the topics of the data-groups mode's workload.
var dataTopics = []string{"chaos-a", "chaos-b", "chaos-c"}

// Fault kinds of the data-groups mode.
const (
	faultKillGroupLeader    = "kill-group-leader"    // SIGKILL the leader of one data group, restart it
	faultPauseGroupLeader   = "pause-group-leader"   // SIGSTOP it, SIGCONT it
	faultIsolateGroupLeader = "isolate-group-leader" // partition it from every other node, heal
	faultKillMetaLeader     = "kill-meta-leader"     // the same three on the metadata (default) group's leader
	faultPauseMetaLeader    = "pause-meta-leader"
	faultIsolateMetaLeader  = "isolate-meta-leader"
	faultKillLeaders        = "kill-leaders"    // SIGKILL every group's leader at once (metadata and data), restart them
	faultPauseLeaders       = "pause-leaders"   // SIGSTOP them all, SIGCONT them
	faultIsolateLeaders     = "isolate-leaders" // each leader alone on its side, the other nodes together, heal
	faultKillDuringMove     = "kill-during-move"
)

// dataKinds are the data-groups mode's fault kinds (its default).
var dataKinds = []string{faultKillGroupLeader, faultPauseGroupLeader, faultIsolateGroupLeader,
	faultKillMetaLeader, faultPauseMetaLeader, faultIsolateMetaLeader,
	faultKillLeaders, faultPauseLeaders, faultIsolateLeaders, faultKillDuringMove}

// groupInfo is one data group in GET /v1/cluster.
type groupInfo struct {
	ID      string   `json:"id"`
	Members []string `json:"members"`
	Leader  string   `json:"leader"`
	Topics  int      `json:"topics"`
}

// clusterGroups is GET /v1/cluster's data groups through n.
func clusterGroups(ctx context.Context, n *tc.Node) ([]groupInfo, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := n.Do(rctx, http.MethodGet, "/v1/cluster", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var ci struct {
		Groups []groupInfo `json:"groups"`
	}
	if err == nil {
		err = r.JSON(&ci)
	}
	return ci.Groups, err
}

// topicPlacement is a topic's data group and leader through n.
func topicPlacement(ctx context.Context, n *tc.Node, topic string) (group, leader string, err error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := n.Do(rctx, http.MethodGet, "/v1/topics/"+topic, nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var got struct {
		Placement struct {
			Group  string `json:"group"`
			Leader string `json:"leader"`
		} `json:"placement"`
	}
	if err == nil {
		err = r.JSON(&got)
	}
	return got.Placement.Group, got.Placement.Leader, err
}

// waitSpread waits (bounded) until every topic is in a data group of its
// own and the groups are led by distinct nodes, and answers each topic's
// group and leader. Placement that did not spread them fails the run
// before any fault.
func waitSpread(ctx context.Context, c *tc.Cluster, topics []string) (map[string][2]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var last map[string][2]string
	for {
		got := map[string][2]string{}
		groups, leaders := map[string]bool{}, map[string]bool{}
		for i, tp := range topics {
			n := c.Node(i % len(c.Nodes()))
			g, l, err := topicPlacement(ctx, n, tp)
			if err == nil && g != "" && l != "" {
				got[tp] = [2]string{g, l}
				groups[g], leaders[l] = true, true
			}
		}
		if len(groups) == len(topics) && len(leaders) == len(topics) {
			return got, nil
		}
		last = got
		if ctx.Err() != nil {
			return nil, fmt.Errorf("topics %v not in %d data groups led by %d distinct nodes within 60 s: %v", topics, len(topics), len(topics), last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// groupsOnce answers the data groups with their agreed leader when every
// live member of every group names the same live leader, which names
// itself; otherwise why not.
func groupsOnce(ctx context.Context, c *tc.Cluster) ([]groupInfo, string) {
	views := map[string]map[string]groupInfo{} // node → group → its view
	var dir []groupInfo
	for _, n := range c.Live() {
		gs, err := clusterGroups(ctx, n)
		if err != nil {
			return nil, fmt.Sprintf("%s: GET /v1/cluster: %v", n.ID(), err)
		}
		views[n.ID()] = map[string]groupInfo{}
		for _, g := range gs {
			views[n.ID()][g.ID] = g
		}
		if len(gs) > len(dir) {
			dir = gs
		}
	}
	if len(dir) == 0 {
		return nil, "no data group known"
	}
	out := make([]groupInfo, 0, len(dir))
	for _, g := range dir {
		leader := ""
		for _, m := range g.Members {
			n := c.NodeByID(m)
			if n == nil || !n.Live() {
				continue
			}
			l := views[m][g.ID].Leader
			if l == "" || (leader != "" && l != leader) {
				return nil, fmt.Sprintf("group %s (members %v): %s names leader %q, others %q", g.ID, g.Members, m, l, leader)
			}
			leader = l
		}
		ln := c.NodeByID(leader)
		if ln == nil || !ln.Live() || views[leader][g.ID].Leader != leader {
			return nil, fmt.Sprintf("group %s (members %v): leader %q is not a live member naming itself", g.ID, g.Members, leader)
		}
		g.Leader = leader
		out = append(out, g)
	}
	return out, ""
}

// waitGroups waits (bounded by ctx) until every data group has a leader
// its live members agree on.
func waitGroups(ctx context.Context, c *tc.Cluster) ([]groupInfo, error) {
	for {
		gs, why := groupsOnce(ctx, c)
		if gs != nil {
			return gs, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("data groups without an agreed leader: %v; %s", err, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldGroups is the data groups node n holds open, by GET
// /v1/internal/status sent with admin (a node-to-node route: with TLS it
// needs a client certificate of the cluster's CA).
func heldGroups(ctx context.Context, admin *tc.Client, n *tc.Node) (map[string]uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := admin.Do(rctx, http.MethodGet, n.URL()+"/v1/internal/status", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	var st struct {
		Groups map[string]uint64 `json:"groups"`
	}
	if err == nil {
		err = r.JSON(&st)
	}
	return st.Groups, err
}

// movesOnce answers "" when every data group's replicas are where the
// directory says: each member holds it open, no other node holds it open
// or keeps its files; otherwise what is still moving.
func movesOnce(ctx context.Context, c *tc.Cluster, admin *tc.Client, groups []groupInfo) string {
	var left []string
	for _, n := range c.Nodes() {
		held, err := heldGroups(ctx, admin, n)
		if err != nil {
			return fmt.Sprintf("%s: status: %v", n.ID(), err)
		}
		for _, g := range groups {
			member := slices.Contains(g.Members, n.ID())
			_, open := held[g.ID]
			_, statErr := os.Stat(filepath.Join(n.DataDir(), "groups", g.ID))
			switch {
			case member && !open:
				left = append(left, fmt.Sprintf("%s does not hold %s yet", n.ID(), g.ID))
			case !member && open:
				left = append(left, fmt.Sprintf("%s still holds %s", n.ID(), g.ID))
			case !member && statErr == nil:
				left = append(left, fmt.Sprintf("%s keeps the files of %s", n.ID(), g.ID))
			}
		}
	}
	return strings.Join(left, "; ")
}

// waitMoves waits (bounded) until every move is done (movesOnce) and
// every data group has an agreed leader.
func waitMoves(ctx context.Context, c *tc.Cluster, admin *tc.Client, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	why := ""
	for {
		gs, w := groupsOnce(ctx, c)
		if gs != nil {
			w = movesOnce(ctx, c, admin, gs)
			if w == "" {
				return nil
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("moves not done within %v: %s", d, why)
		}
		why = w // (not an answer cut off by the deadline)
		time.Sleep(200 * time.Millisecond)
	}
}

// leaders are the metadata leader and each data group's leader, by group
// ("" for the metadata group).
func (nm *Nemesis) leaders() (map[string]*tc.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := nm.c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	gs, err := waitGroups(ctx, nm.c)
	if err != nil {
		return nil, err
	}
	out := map[string]*tc.Node{"": l}
	for _, g := range gs {
		out[g.ID] = nm.c.NodeByID(g.Leader)
	}
	return out, nil
}

// injectGroups injects one fault of the data-groups mode; it answers
// false for a kind that is not one.
func (nm *Nemesis) injectGroups(kind string) (bool, error) {
	if !slices.Contains(dataKinds, kind) {
		return false, nil
	}
	if kind == faultKillDuringMove {
		return true, nm.killDuringMove()
	}
	ls, err := nm.leaders()
	if err != nil {
		return true, fmt.Errorf("before %s: %w", kind, err)
	}
	var victims []*tc.Node
	what := ""
	switch kind {
	case faultKillGroupLeader, faultPauseGroupLeader, faultIsolateGroupLeader:
		var gids []string
		for g := range ls {
			if g != "" {
				gids = append(gids, g)
			}
		}
		sort.Strings(gids)
		g := gids[nm.rng.IntN(len(gids))]
		victims, what = []*tc.Node{ls[g]}, "leader of data group "+g
	case faultKillMetaLeader, faultPauseMetaLeader, faultIsolateMetaLeader:
		victims, what = []*tc.Node{ls[""]}, "metadata leader"
	default:
		seen := map[*tc.Node]bool{}
		for _, g := range sortedGroupKeys(ls) {
			if n := ls[g]; !seen[n] {
				seen[n] = true
				victims = append(victims, n)
			}
		}
		what = "every group's leader"
	}
	nm.Counts[kind]++
	switch kind {
	case faultKillGroupLeader, faultKillMetaLeader, faultKillLeaders:
		hold := nm.between(300*time.Millisecond, 3*time.Second)
		nm.logf("%s: SIGKILL %v (%s) for %v", kind, ids(victims), what, hold)
		for _, v := range victims {
			v.Kill()
		}
		time.Sleep(hold)
		for _, v := range victims {
			v.Restart()
		}
	case faultPauseGroupLeader, faultPauseMetaLeader, faultPauseLeaders:
		hold := nm.between(500*time.Millisecond, 5*time.Second)
		nm.logf("%s: SIGSTOP %v (%s) for %v", kind, ids(victims), what, hold)
		for _, v := range victims {
			v.Pause()
			nm.paused[v] = true
		}
		time.Sleep(hold)
		for _, v := range victims {
			v.Resume()
			delete(nm.paused, v)
		}
	default:
		var sides [][]string
		var rest []string
		for _, n := range nm.c.Nodes() {
			if slices.Contains(victims, n) {
				sides = append(sides, []string{n.ID()})
			} else {
				rest = append(rest, n.ID())
			}
		}
		if len(rest) > 0 {
			sides = append(sides, rest)
		}
		mode := Mode(nm.rng.IntN(2))
		hold := nm.between(1*time.Second, 6*time.Second)
		nm.logf("%s: partition %v (%s; %s) for %v", kind, sides, what, mode, hold)
		nm.net.Partition(mode, sides...)
		time.Sleep(hold)
		nm.net.Heal()
		nm.logf("%s: healed", kind)
	}
	return true, nil
}

func sortedGroupKeys(m map[string]*tc.Node) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// move is one entry of a rebalance's or a drain's answer.
type move struct {
	Group  string `json:"group"`
	From   string `json:"from"`
	To     string `json:"to"`
	Leader string `json:"leader"`
}

// killDuringMove starts a move (a rebalance after a drain, else a drain
// of a seeded node) and, while it runs, SIGKILLs a node it involves: the
// replica's old or new node or the group's leader. The node restarts;
// the move must then complete (every member holds its replica, no other
// node keeps one).
func (nm *Nemesis) killDuringMove() error {
	ls, err := nm.leaders()
	if err != nil {
		return fmt.Errorf("before %s: %w", faultKillDuringMove, err)
	}
	meta := ls[""]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var moves []move
	op := ""
	if nm.drained != "" {
		op = "/v1/cluster/rebalance"
		if moves, err = nm.postMove(ctx, meta, op); err != nil {
			return err
		}
		nm.drained = ""
	}
	if len(moves) == 0 {
		nodes := nm.c.Nodes()
		x := nodes[nm.rng.IntN(len(nodes))].ID()
		op = "/v1/cluster/nodes/" + x + "/drain"
		if moves, err = nm.postMove(ctx, meta, op); err != nil {
			return err
		}
		nm.drained = x
	}
	nm.Counts[faultKillDuringMove]++
	var involved []*tc.Node
	for _, m := range moves {
		for _, id := range []string{m.From, m.To} {
			if n := nm.c.NodeByID(id); n != nil && !slices.Contains(involved, n) {
				involved = append(involved, n)
			}
		}
		if l := ls[m.Group]; l != nil && !slices.Contains(involved, l) {
			involved = append(involved, l)
		}
	}
	if len(involved) == 0 {
		nm.logf("%s: POST %s moved nothing", faultKillDuringMove, op)
		return nil
	}
	victim := involved[nm.rng.IntN(len(involved))]
	wait := nm.between(0, 2*time.Second)
	hold := nm.between(300*time.Millisecond, 3*time.Second)
	nm.logf("%s: POST %s: %+v; SIGKILL %s after %v for %v", faultKillDuringMove, op, moves, victim.ID(), wait, hold)
	time.Sleep(wait)
	victim.Kill()
	time.Sleep(hold)
	victim.Restart()
	t0 := time.Now()
	if err := waitMoves(context.Background(), nm.c, nm.admin, 90*time.Second); err != nil {
		return fmt.Errorf("%s: %w", faultKillDuringMove, err)
	}
	nm.logf("%s: moves done %v after the restart", faultKillDuringMove, time.Since(t0).Round(time.Millisecond))
	return nil
}

// postMove sends a rebalance or a drain to the metadata leader, retrying
// (bounded by ctx) while it answers 503 or nothing (a request sent again
// only rewrites the members again, to the same or a newer plan).
func (nm *Nemesis) postMove(ctx context.Context, meta *tc.Node, path string) ([]move, error) {
	var last string
	for {
		via := meta
		if !via.Live() {
			via = nm.c.Live()[0]
		}
		r, err := via.Do(ctx, http.MethodPost, path, nil, nil)
		if err == nil && r.Status == http.StatusOK {
			var out struct {
				Moves []move `json:"moves"`
			}
			if err := r.JSON(&out); err != nil {
				return nil, fmt.Errorf("POST %s: %v", path, err)
			}
			return out.Moves, nil
		}
		if err == nil && r.Status != http.StatusServiceUnavailable {
			return nil, fmt.Errorf("POST %s via %s: %d %s", path, via.ID(), r.Status, truncate(string(r.Body), 200))
		}
		last = fmt.Sprint(err)
		if err == nil {
			last = fmt.Sprintf("%d %s", r.Status, truncate(string(r.Body), 200))
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("POST %s: %v (last: %s)", path, ctx.Err(), last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// compareGroups compares the replicas of every group, each at one applied
// index: the default (metadata) group's state file on every node, and each
// data group's (groups/<id>/fsm.db) on its members. It answers what it
// compared, the differences, or an error for a comparison it could not
// make (which fails the run: no group is skipped).
func compareGroups(c *tc.Cluster, tmp string) ([]string, []string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gs, err := waitGroups(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	var compared, diffs []string
	d, at, err := compareGroup(c.Nodes(), fsmFile, tmp)
	if err != nil {
		return nil, nil, fmt.Errorf("default group: %w", err)
	}
	compared = append(compared, fmt.Sprintf("default: %d replicas at index %d", len(c.Nodes()), at))
	diffs = append(diffs, d...)
	for _, g := range gs {
		var members []*tc.Node
		for _, m := range g.Members {
			n := c.NodeByID(m)
			if n == nil {
				return compared, nil, fmt.Errorf("group %s: member %s is not a node of the cluster", g.ID, m)
			}
			members = append(members, n)
		}
		d, at, err := compareGroup(members, filepath.Join("groups", g.ID, fsmFile), tmp)
		if err != nil {
			return compared, nil, fmt.Errorf("data group %s %v: %w", g.ID, g.Members, err)
		}
		compared = append(compared, fmt.Sprintf("%s (%d topics): %v at index %d", g.ID, g.Topics, g.Members, at))
		for _, x := range d {
			diffs = append(diffs, "group "+g.ID+": "+x)
		}
	}
	if len(gs) < 2 {
		return compared, nil, fmt.Errorf("%d data groups, want several", len(gs))
	}
	return compared, diffs, nil
}
