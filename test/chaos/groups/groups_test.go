// Package groups runs the chaos suite's data-groups mode (test/chaos,
// docs/reliability.md) as a package of its own, so that its run and the
// other bounded chaos runs each stay well within go test's default limit
// per package.
package groups

import (
	"testing"
	"time"

	"github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/chaos"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// TestChaosDataGroups is the bounded run of the data-groups mode CI makes
// once per run: five nodes with --data-groups, three topics placed in three
// data groups led by three nodes (checked before any fault), the workload
// on each topic, and faults aimed at the structure: kill -9, SIGSTOP and a
// partition of one data group's leader, of the metadata group's leader and
// of every group's leader at once, and a node killed while a drain or a
// rebalance moves replicas (the move must complete after it restarts). The
// checker runs per topic; the replicas are compared per group, and a group
// that cannot be compared fails the run. Longer runs: -chaos.data-groups
// with TestChaos or TestSoak in test/chaos.
func TestChaosDataGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("the data-groups chaos run takes about a minute and a half; skipped in -short mode")
	}
	chaos.Run(t, chaos.DataGroupsConfig(401, 60*time.Second))
}
