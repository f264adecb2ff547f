// Package test holds black-box system tests: they build cmd/mqd, start real
// clusters of processes on loopback ports (internal/testcluster) and drive
// them over HTTP only. Run them with `go test ./test/`; each test bounds its
// own waits, and at most two clusters run at once with the default -parallel
// on a two-core machine.
package test

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
