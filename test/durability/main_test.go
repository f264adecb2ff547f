// Package durability holds the black-box system tests of what a node's files
// go through: damaged and lost files and log tails, full and small disks,
// the data dir, snapshots, restarts, backup and restore. Like every package
// under test/ they build cmd/mqd, start real clusters on loopback ports
// (internal/testcluster) and reach them only from outside; test/systest
// holds the helpers they share.
package durability

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
