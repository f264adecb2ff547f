// Package cluster holds the black-box system tests of a cluster's life:
// failover, quorum, membership changes, clock checks, data groups and their
// placement, moves and growth, rolling upgrades and format changes, graceful
// shutdown. Like every package under test/ they build cmd/mqd, start real
// clusters on loopback ports (internal/testcluster) and reach them only from
// outside; test/systest holds the helpers they share.
package cluster

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
