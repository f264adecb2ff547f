package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// Fault kinds the nemesis injects, one at a time.
const (
	faultKillLeader     = "kill-leader"     // SIGKILL the leader, restart it
	faultKillFollower   = "kill-follower"   // SIGKILL a follower, restart it
	faultPauseLeader    = "pause-leader"    // SIGSTOP the leader, SIGCONT it
	faultPauseFollower  = "pause-follower"  // SIGSTOP a follower, SIGCONT it
	faultIsolateLeader  = "isolate-leader"  // partition {leader} | {followers}, heal
	faultSplitFollower  = "split-follower"  // partition {a follower} | {leader, other}, heal
	faultTransferLeader = "transfer-leader" // SIGTERM the leader (it hands off leadership), restart it
	faultKillAll        = "kill-all"        // SIGKILL every node at once, restart them all
)

var faultKinds = []string{faultKillLeader, faultKillFollower, faultPauseLeader, faultPauseFollower,
	faultIsolateLeader, faultSplitFollower, faultTransferLeader, faultKillAll}

// Nemesis injects faults on a seeded schedule. Its methods run on the test's
// goroutine (the cluster's node controls may call t.Fatal).
type Nemesis struct {
	t      *testing.T
	c      *tc.Cluster
	net    *Net
	rng    *rand.Rand
	start  time.Time
	Counts map[string]int
	Notes  map[string]int // observations worth a figure (slow graceful stops)
	paused map[*tc.Node]bool
	kinds  []string
	power  *powerMounts // the nodes' power-loss filesystems (power-cut kinds)
	noTorn bool         // power cuts never tear a write
	// groups: the cluster has data groups (datagroups.go): ready means
	// every data group has an agreed leader too.
	groups  bool
	drained string     // the node a kill-during-move drained last ("": none since the last rebalance)
	admin   *tc.Client // for node-to-node routes (a client certificate with TLS)
}

func newNemesis(t *testing.T, c *tc.Cluster, nw *Net, seed int64, kinds []string, power *powerMounts) *Nemesis {
	if len(kinds) == 0 {
		kinds = faultKinds
	}
	return &Nemesis{t: t, c: c, net: nw, rng: rand.New(rand.NewPCG(uint64(seed), 0x6e656d)),
		start: time.Now(), Counts: map[string]int{}, Notes: map[string]int{}, paused: map[*tc.Node]bool{}, kinds: kinds, power: power}
}

func (nm *Nemesis) logf(format string, args ...any) {
	nm.t.Logf("nemesis +%5.1fs: %s", time.Since(nm.start).Seconds(), fmt.Sprintf(format, args...))
}

func (nm *Nemesis) between(min, max time.Duration) time.Duration {
	return min + time.Duration(nm.rng.Int64N(int64(max-min)+1))
}

func (nm *Nemesis) sleep(min, max time.Duration) { time.Sleep(nm.between(min, max)) }

// Run injects faults until the deadline or maxFaults, each followed by its
// recovery and a wait for the cluster to be ready again. The order is a
// seeded permutation of every kind (so a long enough run sees each; power
// cuts alternate with the other kinds), then seeded random picks. It
// returns an error if the cluster does not recover.
func (nm *Nemesis) Run(deadline time.Time, maxFaults int) error {
	order := nm.order()
	for i := 0; i < maxFaults && time.Now().Before(deadline); i++ {
		kind := order[i%len(order)]
		if i >= len(order) {
			kind = nm.kinds[nm.rng.IntN(len(nm.kinds))]
		}
		if err := nm.inject(kind); err != nil {
			return err
		}
		if err := nm.waitReady(45*time.Second, kind); err != nil {
			return err
		}
		quiet := nm.between(500*time.Millisecond, 2*time.Second)
		if rest := time.Until(deadline); rest < quiet {
			quiet = max(rest, 0)
		}
		time.Sleep(quiet)
	}
	return nil
}

func (nm *Nemesis) waitReady(d time.Duration, after string) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	l, err := nm.c.WaitReady(ctx)
	if err != nil {
		return fmt.Errorf("cluster not ready %v after %s: %w", d, after, err)
	}
	if !nm.groups {
		nm.logf("ready again after %v, leader %s", time.Since(start).Round(time.Millisecond), l.ID())
		return nil
	}
	gs, err := waitGroups(ctx, nm.c)
	if err != nil {
		return fmt.Errorf("cluster not ready %v after %s: %w", d, after, err)
	}
	var gl []string
	for _, g := range gs {
		gl = append(gl, g.ID+" "+g.Leader)
	}
	nm.logf("ready again after %v, metadata leader %s, data groups' leaders %v", time.Since(start).Round(time.Millisecond), l.ID(), gl)
	return nil
}

func (nm *Nemesis) roles() (*tc.Node, []*tc.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := nm.c.Leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	var fs []*tc.Node
	for _, n := range nm.c.Nodes() {
		if n != l {
			fs = append(fs, n)
		}
	}
	return l, fs, nil
}

func ids(ns []*tc.Node) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.ID()
	}
	return out
}

func (nm *Nemesis) inject(kind string) error {
	if done, err := nm.injectGroups(kind); done {
		return err
	}
	l, fs, err := nm.roles()
	if err != nil {
		return fmt.Errorf("before %s: %w", kind, err)
	}
	f := fs[nm.rng.IntN(len(fs))]
	others := func(x *tc.Node) []string {
		var out []string
		for _, n := range nm.c.Nodes() {
			if n != x {
				out = append(out, n.ID())
			}
		}
		return out
	}
	nm.Counts[kind]++
	switch kind {
	case faultKillLeader, faultKillFollower:
		victim := l
		if kind == faultKillFollower {
			victim = f
		}
		hold := nm.between(300*time.Millisecond, 3*time.Second)
		nm.logf("%s: SIGKILL %s for %v", kind, victim.ID(), hold)
		victim.Kill()
		time.Sleep(hold)
		victim.Restart()
	case faultPauseLeader, faultPauseFollower:
		victim := l
		if kind == faultPauseFollower {
			victim = f
		}
		hold := nm.between(500*time.Millisecond, 5*time.Second)
		nm.logf("%s: SIGSTOP %s for %v", kind, victim.ID(), hold)
		victim.Pause()
		nm.paused[victim] = true
		time.Sleep(hold)
		victim.Resume()
		delete(nm.paused, victim)
	case faultIsolateLeader, faultSplitFollower:
		minority := l
		if kind == faultSplitFollower {
			minority = f
		}
		mode := Mode(nm.rng.IntN(2))
		hold := nm.between(1*time.Second, 6*time.Second)
		nm.logf("%s: partition {%s} | %v (%s) for %v", kind, minority.ID(), others(minority), mode, hold)
		nm.net.Partition(mode, []string{minority.ID()}, others(minority))
		time.Sleep(hold)
		nm.net.Heal()
		nm.logf("%s: healed", kind)
	case faultTransferLeader:
		nm.logf("%s: SIGTERM leader %s", kind, l.ID())
		t0 := time.Now()
		took, err := l.StopWithin(15 * time.Second)
		if err != nil {
			nm.t.Errorf("graceful stop of leader %s: %v (took %v)", l.ID(), err, took)
		}
		if took > 2*time.Second {
			nm.Notes["graceful stop of the leader over 2 s"]++
		}
		// Did leadership move on? Bounded look at the survivors.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nl, lerr := nm.c.Leader(ctx)
		cancel()
		if lerr != nil {
			nm.logf("%s: %s exited in %v; no new leader within 10 s: %v", kind, l.ID(), took.Round(time.Millisecond), lerr)
		} else {
			nm.logf("%s: %s exited in %v; new leader %s agreed %v after SIGTERM", kind, l.ID(), took.Round(time.Millisecond), nl.ID(), time.Since(t0).Round(time.Millisecond))
		}
		nm.sleep(200*time.Millisecond, 1500*time.Millisecond)
		l.Restart()
	case faultKillAll:
		hold := nm.between(200*time.Millisecond, 2*time.Second)
		nm.logf("%s: SIGKILL %v for %v", kind, ids(nm.c.Nodes()), hold)
		nm.c.KillAll()
		time.Sleep(hold)
		nm.c.RestartAll()
	case faultPowerLeader, faultPowerFollower, faultPowerMajority, faultPowerAll:
		return nm.powerCut(kind, l, f)
	default:
		return fmt.Errorf("unknown fault %q", kind)
	}
	return nil
}

// HealAll lifts every fault: heals the network, resumes paused nodes and
// restarts stopped ones.
func (nm *Nemesis) HealAll() {
	nm.net.Heal()
	for n := range nm.paused {
		n.Resume()
		delete(nm.paused, n)
	}
	for _, n := range nm.c.Nodes() {
		if !n.Running() {
			nm.logf("heal: restarting %s", n.ID())
			n.Restart()
		}
	}
}
