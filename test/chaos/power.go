package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mqd/mqd/internal/powerfs"
	tc "github.com/mqd/mqd/internal/testcluster"
)

// Power-cut fault kinds: the victims are SIGKILLed, every write their
// filesystem holds that was not fsynced is dropped (internal/powerfs; a
// torn cut, one in two, keeps a prefix of each file's last unsynced run of
// writes), and they restart on the same mount with the same command.
const (
	faultPowerLeader   = "power-cut-leader"   // one node, the leader (a minority)
	faultPowerFollower = "power-cut-follower" // one node, a follower (a minority)
	faultPowerMajority = "power-cut-majority" // the leader and a follower at once
	faultPowerAll      = "power-cut-all"      // all three at once
)

var powerKinds = []string{faultPowerLeader, faultPowerFollower, faultPowerMajority, faultPowerAll}

// allKinds are every fault kind, power cuts included.
var allKinds = append(append([]string(nil), faultKinds...), powerKinds...)

func isPower(kind string) bool { return slices.Contains(powerKinds, kind) }

// powerMounts are the nodes' power-loss filesystems, by node id.
type powerMounts struct {
	mu sync.Mutex
	fs map[string]*powerfs.FS
}

// usablePowerKinds returns kinds, less the power cuts when this machine
// cannot mount a powerfs (root and /dev/fuse): then a run of power cuts
// only skips, and a mixed run goes on without them. With CI set, it fails.
func usablePowerKinds(t *testing.T, kinds []string) []string {
	if !slices.ContainsFunc(kinds, isPower) {
		return kinds
	}
	err := powerfs.Available()
	if err == nil {
		return kinds
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set and power cuts cannot run: %v", err)
	}
	rest := slices.DeleteFunc(slices.Clone(kinds), isPower)
	if len(rest) == 0 {
		t.Skipf("power cuts cannot run: %v", err)
	}
	t.Logf("power cuts left out of this run: %v", err)
	return rest
}

// mount serves n's data directory from a powerfs whose backing directory is
// under t's temporary directory, unmounted at t's end.
func (pm *powerMounts) mount(t *testing.T, n *tc.Node, seed int64, fileSyncEntries bool) {
	backing := filepath.Join(t.TempDir(), n.ID()+"-disk")
	p, err := powerfs.Mount(backing, n.DataDir(), powerfs.Options{Seed: uint64(seed)<<8 | uint64(len(pm.fs)),
		FileSyncCommitsEntries: fileSyncEntries})
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %v", err)
		}
		t.Skipf("power cuts cannot run: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Errorf("%s: %v", n.ID(), err)
		}
	})
	pm.mu.Lock()
	pm.fs[n.ID()] = p
	pm.mu.Unlock()
}

func (pm *powerMounts) get(id string) *powerfs.FS {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	return pm.fs[id]
}

// powerCut injects one power-cut fault.
func (nm *Nemesis) powerCut(kind string, l, f *tc.Node) error {
	victims := map[string][]*tc.Node{faultPowerLeader: {l}, faultPowerFollower: {f},
		faultPowerMajority: {l, f}, faultPowerAll: nm.c.Nodes()}[kind]
	torn := nm.rng.IntN(2) == 1 && !nm.noTorn
	hold := nm.between(200*time.Millisecond, 2*time.Second)
	nm.logf("%s: SIGKILL %v, cut their power (torn %v), restart after %v", kind, ids(victims), torn, hold)
	for _, v := range victims {
		v.Kill()
	}
	for _, v := range victims {
		p := nm.power.get(v.ID())
		if p == nil {
			return fmt.Errorf("%s: node %s has no power-loss filesystem", kind, v.ID())
		}
		r, err := p.Cut(torn)
		if err != nil {
			return fmt.Errorf("%s on %s: %w", kind, v.ID(), err)
		}
		nm.logf("%s: %s lost %v", kind, v.ID(), r)
	}
	time.Sleep(hold)
	for _, v := range victims {
		v.Restart()
	}
	return nil
}

// order is the first round of faults: a seeded permutation of the kinds;
// when power cuts and other faults are both drawn from, they alternate
// (power cut first), so that a short run has both.
func (nm *Nemesis) order() []string {
	order := append([]string(nil), nm.kinds...)
	nm.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var pw, other []string
	for _, k := range order {
		if isPower(k) {
			pw = append(pw, k)
		} else {
			other = append(other, k)
		}
	}
	if len(pw) == 0 || len(other) == 0 {
		return order
	}
	order = order[:0]
	for i := 0; i < max(len(pw), len(other)); i++ {
		if i < len(pw) {
			order = append(order, pw[i])
		}
		if i < len(other) {
			order = append(order, other[i])
		}
	}
	return order
}
