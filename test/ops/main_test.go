// Package ops holds the black-box system tests of what operators and users
// run: the CLI, the web console in Chromium, the deployment files, TLS (with
// OpenSSL's commands from the docs), the README's commands. Like every
// package under test/ they build cmd/mqd, start real clusters on loopback
// ports (internal/testcluster) and reach them only from outside;
// test/systest holds the helpers they share.
package ops

import (
	"testing"

	"github.com/mqd/mqd/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }
