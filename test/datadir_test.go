package test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// A second mqd started on a running node's data dir fails at once, names
// the process holding the dir, and changes nothing: the first node's files
// keep their identity and it keeps serving what it acknowledged.
func TestSecondProcessOnDataDir(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	mustTopic(t, n, "dd", nil)
	want := mustPublish(t, n, "dd", "kept", nil)
	before := dirInodes(t, n.DataDir())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tc.Binary(t), "--id", "intruder", "--data-dir", n.DataDir(),
		"--http-addr", freeLoopback(t), "--raft-addr", freeLoopback(t))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("second mqd on the same data dir: exit %v after %v, want a non-zero exit at once; output:\n%s", err, took, out.String())
	}
	if took > 3*time.Second {
		t.Errorf("second mqd took %v to fail, want at once", took)
	}
	if msg := out.String(); !strings.Contains(msg, fmt.Sprintf("pid %d", n.PID())) || !strings.Contains(msg, "mqd.lock") {
		t.Errorf("second mqd's message does not name the holder (pid %d) and the lock file:\n%s", n.PID(), msg)
	}
	after := dirInodes(t, n.DataDir())
	for name, ino := range before {
		if after[name] != ino {
			t.Errorf("%s changed identity (inode %d → %d): the second process touched the running node's files", name, ino, after[name])
		}
	}
	msgs, err := drain(ctxFor(t, 30*time.Second), n, "dd", "g", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Offset != want.Offset {
		t.Fatalf("after the second start: got %d messages, want the one published at offset %d", len(msgs), want.Offset)
	}
}

// dirInodes maps each regular file directly in dir to its inode.
func dirInodes(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, e := range ents {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		out[e.Name()] = fi.Sys().(*syscall.Stat_t).Ino
	}
	return out
}

// freeLoopback returns a loopback address whose port was free a moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A data dir records its node's id at the first start. Started under
// another --id it is refused at once, naming the id it holds (raft knows
// members by id: the dir would sit in its cluster as a stranger, never
// voting, leading or ready). Started without --id, the default (the raft
// address) gives way to the recorded id. A new node's id must be one a
// URL and a log line carry as it is.
func TestDataDirKeepsItsNodeID(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	mustTopic(t, n, "id", nil)
	want := mustPublish(t, n, "id", "kept", nil)
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	args, noID := n.Args(), []string{}
	for i := 0; i < len(args); i++ {
		if args[i] == "--id" {
			i++
			continue
		}
		noID = append(noID, args[i])
	}

	out, err := runMqd(t, append([]string{"--id", "other"}, noID...)...)
	if err == nil {
		t.Fatalf("data dir of %s started as node \"other\": exit 0, want a refusal; output:\n%s", n.ID(), out)
	}
	if !strings.Contains(out, "--id "+n.ID()) {
		t.Errorf("the refusal does not name the recorded id (--id %s):\n%s", n.ID(), out)
	}

	n.SetArgs(noID)
	n.Restart()
	ctx := ctxFor(t, 60*time.Second)
	if err := n.WaitReady(ctx); err != nil {
		t.Fatalf("restarted without --id: %v", err)
	}
	ci, err := n.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.Self != n.ID() {
		t.Fatalf("restarted without --id: serves as %q, want the recorded %q", ci.Self, n.ID())
	}
	msgs, err := drain(ctx, n, "id", "g", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Offset != want.Offset {
		t.Fatalf("after the restart: got %d messages, want the one published at offset %d", len(msgs), want.Offset)
	}

	fresh := filepath.Join(t.TempDir(), "fresh")
	out, err = runMqd(t, "--id", "a b", "--data-dir", fresh, "--http-addr", freeLoopback(t), "--raft-addr", freeLoopback(t))
	if err == nil || !strings.Contains(out, "invalid node id") {
		t.Fatalf("new node with id \"a b\": exit %v, want a refusal naming the invalid id; output:\n%s", err, out)
	}
}
