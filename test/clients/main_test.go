// Package clients holds the system tests of mqd's clients and examples:
// the cross-language conformance suite (clients/ in Go, Python, Node.js and
// Java against a real cluster, plain and with TLS and tokens) and the
// runnable examples (examples/), including the three-language pipeline and
// the examples surviving a leader's failover. It builds cmd/mqd once and
// starts real clusters on loopback ports (internal/testcluster); the
// interpreters and the JDK it needs are installed by .ci/run, and without
// them the tests skip (or fail when MQD_EXAMPLES_REQUIRED is set).
package clients

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
