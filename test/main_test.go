// Package test holds the black-box system tests of the HTTP contract:
// publishing, idempotency, consuming, retries and dead letters, process,
// browsing and tracing, authorization, bad input, metrics and logging. They
// build cmd/mqd, start real clusters of processes on loopback ports
// (internal/testcluster) and drive them over HTTP only; test/systest holds
// the helpers every system-test package shares. The other system tests live
// beside it: test/cluster (failover, membership, data groups, upgrades),
// test/durability (damaged and lost files, full disks, snapshots, backups),
// test/ops (the CLI, the console, deployment files, TLS, the README), and
// test/chaos. Run them with `go test ./test/...`; each test bounds its own
// waits, and at most two clusters run at once per package with the default
// -parallel on a two-core machine.
package test

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
