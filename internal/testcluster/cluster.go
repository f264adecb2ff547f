package testcluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Option changes how Start runs the nodes.
type Option func(*config)

type config struct {
	flags        []string
	readyTimeout time.Duration
	client       *Client
	logTail      int
	nodeArgs     []func(*Node) []string
	env          []string
	scheme       string
	binary       string // "": Binary's
	dataGroups   bool   // WithDataGroups: nodes keep the binary's default
}

// WithDataGroups runs the nodes with data groups, the binary's default
// (SPEC section 12). Without it (nor a --data-groups flag of the test's
// own) the harness starts this repository's binary with
// --data-groups=false: most system tests were written for the one raft
// group and test the mechanisms of a group through the default one (its
// files, its leader). MQD_TEST_DATA_GROUPS=1 in the environment runs
// every test on the binary's default instead.
func WithDataGroups() Option { return func(c *config) { c.dataGroups = true } }

// noDataGroupsFlag: MQD_TEST_BINARY is a binary without --data-groups.
var noDataGroupsFlag bool

// defaultFlags are the flags the harness gives every node before the
// test's own (which may override them).
func (c *config) defaultFlags() []string {
	if c.dataGroups || c.binary != "" || noDataGroupsFlag || os.Getenv("MQD_TEST_DATA_GROUPS") == "1" {
		return nil // an older release's binary has no such flag
	}
	for _, f := range c.flags {
		if strings.HasPrefix(f, "--data-groups") {
			return nil
		}
	}
	return []string{"--data-groups=false"}
}

// WithBinary runs every node from the mqd binary at path instead of the
// one built from this repository (an older release, for upgrade tests);
// Node.SetBinary changes one node's for its next starts.
func WithBinary(path string) Option { return func(c *config) { c.binary = path } }

// WithHTTPS makes the harness speak https to nodes whose TLS flags the
// test passes itself (pair it with WithClient and a client trusting its CA).
func WithHTTPS() Option { return func(c *config) { c.scheme = "https" } }

// WithEnv adds environment variables ("NAME=value") to every node's
// process (for secrets that must not show in the command line or logs).
func WithEnv(kv ...string) Option { return func(c *config) { c.env = append(c.env, kv...) } }

// WithFlags appends command-line flags to every node's command.
func WithFlags(flags ...string) Option {
	return func(c *config) { c.flags = append(c.flags, flags...) }
}

// WithNodeArgs appends, to each node's command, the flags that fn returns
// for it. Start calls fn once per node, after the node's id and addresses are
// chosen (ID, HTTPAddr, RaftAddr, DataDir are set) and before any node
// starts; the flags then stay the same across restarts. Use it for per-node
// flags such as --raft-advertise-addr.
func WithNodeArgs(fn func(n *Node) []string) Option {
	return func(c *config) { c.nodeArgs = append(c.nodeArgs, fn) }
}

// WithSnapshot sets --snapshot-threshold, --snapshot-interval and --trailing-logs.
func WithSnapshot(threshold int, interval time.Duration, trailingLogs int) Option {
	return WithFlags("--snapshot-threshold", strconv.Itoa(threshold),
		"--snapshot-interval", interval.String(),
		"--trailing-logs", strconv.Itoa(trailingLogs))
}

// WithLogLevel sets --log-level.
func WithLogLevel(level string) Option { return WithFlags("--log-level", level) }

// WithReadyTimeout bounds how long Start waits for the cluster (default 30 s).
func WithReadyTimeout(d time.Duration) Option { return func(c *config) { c.readyTimeout = d } }

// WithClient uses c for every request the harness and its nodes send.
func WithClient(cl *Client) Option { return func(c *config) { c.client = cl } }

// WithLogTail sets how many lines of each node's log a failed test prints (default 60).
func WithLogTail(lines int) Option { return func(c *config) { c.logTail = lines } }

// Cluster is a set of mqd processes started by Start.
type Cluster struct {
	tb     testing.TB
	nodes  []*Node
	client *Client
	root   string
	cfg    config
}

// Start runs n nodes (ids n1..nN) on free loopback ports with data under
// tb.TempDir(), forming one cluster (n == 1: a self-bootstrapped single node),
// and waits until every node is ready and agrees on the leader. Every process
// is killed in tb's cleanup; if tb failed, each node's log tail is printed.
func Start(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	cfg := config{readyTimeout: 30 * time.Second, client: DefaultClient, logTail: 60, scheme: "http"}
	for _, o := range opts {
		o(&cfg)
	}
	Binary(tb) // build before taking ports or the clock
	root := tb.TempDir()
	c := &Cluster{tb: tb, client: cfg.client, root: root, cfg: cfg}
	var httpAddrs []string
	for i := range n {
		h, err := freeAddr()
		if err != nil {
			tb.Fatal(err)
		}
		r, err := freeAddr()
		if err != nil {
			tb.Fatal(err)
		}
		id := "n" + strconv.Itoa(i+1)
		c.nodes = append(c.nodes, &Node{tb: tb, client: cfg.client, id: id, httpAddr: h, raftAddr: r,
			dataDir: filepath.Join(root, id), logPath: filepath.Join(root, id+".log"),
			env: cfg.env, scheme: cfg.scheme, binary: cfg.binary})
		httpAddrs = append(httpAddrs, h)
	}
	for _, nd := range c.nodes {
		nd.args = []string{"--id", nd.id, "--data-dir", nd.dataDir, "--http-addr", nd.httpAddr, "--raft-addr", nd.raftAddr}
		if n > 1 {
			nd.args = append(nd.args, "--bootstrap-expect", strconv.Itoa(n), "--join", strings.Join(httpAddrs, ","))
		}
		nd.args = append(nd.args, cfg.defaultFlags()...)
		nd.args = append(nd.args, cfg.flags...)
		for _, fn := range cfg.nodeArgs {
			nd.args = append(nd.args, fn(nd)...)
		}
	}
	tb.Cleanup(func() {
		c.KillAll()
		c.checkRaces()
		if tb.Failed() {
			c.dumpLogs(cfg.logTail)
		}
	})
	for _, nd := range c.nodes {
		if err := nd.start(); err != nil {
			tb.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.readyTimeout)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		tb.Fatalf("testcluster: %d-node cluster not ready within %v: %v", n, cfg.readyTimeout, err)
	}
	return c
}

// AddNode starts a new node with id, an empty data dir and free ports,
// joining the running cluster through every other node's HTTP address
// (--join, no --bootstrap-expect), with the cluster's flags. It does not
// wait: use WaitReady.
func (c *Cluster) AddNode(id string) *Node {
	c.tb.Helper()
	if c.NodeByID(id) != nil {
		c.tb.Fatalf("testcluster: node %s exists", id)
	}
	h, err := freeAddr()
	if err != nil {
		c.tb.Fatal(err)
	}
	r, err := freeAddr()
	if err != nil {
		c.tb.Fatal(err)
	}
	nd := &Node{tb: c.tb, client: c.client, id: id, httpAddr: h, raftAddr: r,
		dataDir: filepath.Join(c.root, id), logPath: filepath.Join(c.root, id+".log"),
		env: c.cfg.env, scheme: c.cfg.scheme, binary: c.cfg.binary}
	var join []string
	for _, o := range c.nodes {
		join = append(join, o.httpAddr)
	}
	nd.args = []string{"--id", id, "--data-dir", nd.dataDir, "--http-addr", h, "--raft-addr", r, "--join", strings.Join(join, ",")}
	nd.args = append(nd.args, c.cfg.defaultFlags()...)
	nd.args = append(nd.args, c.cfg.flags...)
	for _, fn := range c.cfg.nodeArgs {
		nd.args = append(nd.args, fn(nd)...)
	}
	c.nodes = append(c.nodes, nd)
	if err := nd.start(); err != nil {
		c.tb.Fatal(err)
	}
	return nd
}

// Nodes are all nodes, running or not, in id order.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// Node returns the i-th node (0-based).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// NodeByID returns the node with that id, or nil.
func (c *Cluster) NodeByID(id string) *Node {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// Client is the HTTP client the cluster's nodes use.
func (c *Cluster) Client() *Client { return c.client }

// Live are the nodes that are running and not paused.
func (c *Cluster) Live() []*Node {
	var out []*Node
	for _, n := range c.nodes {
		if n.Live() {
			out = append(out, n)
		}
	}
	return out
}

// Quorum is a majority of the cluster's nodes.
func (c *Cluster) Quorum() int { return len(c.nodes)/2 + 1 }

// KillAll sends SIGKILL to every running node and waits for each.
func (c *Cluster) KillAll() {
	for _, n := range c.nodes {
		n.kill()
	}
}

// RestartAll starts every stopped node again (running ones are killed first).
func (c *Cluster) RestartAll() {
	c.tb.Helper()
	for _, n := range c.nodes {
		n.Restart()
	}
}

// views asks every live node for /v1/cluster; unreachable nodes are left out.
func (c *Cluster) views(ctx context.Context) map[*Node]ClusterInfo {
	out := map[*Node]ClusterInfo{}
	for _, n := range c.Live() {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ci, err := n.Cluster(rctx)
		cancel()
		if err == nil {
			out[n] = ci
		}
	}
	return out
}

// leaderOnce returns the leader if a majority of the cluster's nodes name it
// and it is live and names itself.
func (c *Cluster) leaderOnce(ctx context.Context) (*Node, string) {
	views := c.views(ctx)
	count := map[string]int{}
	for _, ci := range views {
		if id := ci.LeaderID(); id != "" {
			count[id]++
		}
	}
	for id, k := range count {
		l := c.NodeByID(id)
		if k < c.Quorum() || l == nil {
			continue
		}
		if self, ok := views[l]; ok && self.LeaderID() == id {
			return l, ""
		}
	}
	return nil, fmt.Sprintf("leader views: %s", describeViews(views))
}

func describeViews(views map[*Node]ClusterInfo) string {
	var parts []string
	for n, ci := range views {
		parts = append(parts, fmt.Sprintf("%s: leader %q applied %d commit %d", n.id, ci.LeaderID(), ci.AppliedIndex, ci.CommitIndex))
	}
	if len(parts) == 0 {
		return "no node answered"
	}
	return strings.Join(parts, " ")
}

// Leader polls the live nodes until a majority of the cluster names the same
// live leader, and returns it. It gives up when ctx ends (30 s if no deadline).
func (c *Cluster) Leader(ctx context.Context) (*Node, error) {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		l, why := c.leaderOnce(ctx)
		if l != nil {
			return l, nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("no agreed leader: %v; %s", err, why)
		}
	}
}

// Followers returns the live nodes other than the leader.
func (c *Cluster) Followers(ctx context.Context) ([]*Node, error) {
	l, err := c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Node
	for _, n := range c.Live() {
		if n != l {
			out = append(out, n)
		}
	}
	return out, nil
}

// WaitReady waits until every running node answers /readyz 200 and all of
// them name the same live leader, which it returns. Bounded by ctx (30 s if
// ctx has no deadline).
func (c *Cluster) WaitReady(ctx context.Context) (*Node, error) {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	var why string
	for {
		l, w := c.readyOnce(ctx)
		if l != nil {
			return l, nil
		}
		why = w
		for _, n := range c.nodes {
			if err := n.crashed(); err != nil {
				return nil, err
			}
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%v; %s", err, why)
		}
	}
}

func (c *Cluster) readyOnce(ctx context.Context) (*Node, string) {
	live := c.Live()
	if len(live) == 0 {
		return nil, "no live node"
	}
	var notReady []string
	for _, n := range live {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := n.Do(rctx, "GET", "/readyz", nil, nil)
		cancel()
		switch {
		case err != nil:
			notReady = append(notReady, fmt.Sprintf("%s: /readyz: %v", n.id, err))
		case r.Status != 200:
			notReady = append(notReady, fmt.Sprintf("%s: /readyz %d %s", n.id, r.Status, truncate(r.Body, 200)))
		}
	}
	views := c.views(ctx)
	if len(notReady) > 0 {
		return nil, strings.Join(notReady, "; ") + "; " + describeViews(views)
	}
	var leader string
	for _, n := range live {
		ci, ok := views[n]
		if !ok {
			return nil, fmt.Sprintf("node %s: /v1/cluster unanswered", n.id)
		}
		if ci.LeaderID() == "" || (leader != "" && ci.LeaderID() != leader) {
			return nil, "leader views: " + describeViews(views)
		}
		leader = ci.LeaderID()
	}
	l := c.NodeByID(leader)
	if l == nil || !l.Live() {
		return nil, fmt.Sprintf("named leader %q is not a live node", leader)
	}
	return l, ""
}

// raceMarker starts every report of Go's race detector.
const raceMarker = "WARNING: DATA RACE"

// checkRaces fails the test with the first data race report in each
// node's log (a race-built node keeps running after a report).
func (c *Cluster) checkRaces() {
	for _, n := range c.nodes {
		b, err := os.ReadFile(n.logPath)
		if err != nil {
			continue
		}
		i := strings.Index(string(b), raceMarker)
		if i < 0 {
			continue
		}
		report := string(b[i:])
		if j := strings.Index(report, "\n=================="); j > 0 {
			report = report[:j]
		}
		c.tb.Errorf("testcluster: node %s reported a data race:\n%s", n.id, report)
	}
}

func (c *Cluster) dumpLogs(lines int) {
	for _, n := range c.nodes {
		tail, err := tailFile(n.logPath, lines)
		if err != nil {
			c.tb.Logf("node %s: log: %v", n.id, err)
			continue
		}
		c.tb.Logf("---- node %s (%s) log, last %d lines ----\n%s", n.id, n.httpAddr, lines, tail)
	}
}

func tailFile(path string, lines int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ring := make([]string, 0, lines)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if len(ring) == lines {
			ring = ring[1:]
		}
		ring = append(ring, sc.Text())
	}
	return strings.Join(ring, "\n"), sc.Err()
}
