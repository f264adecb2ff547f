package durability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// A second mqd started on a running node's data dir fails at once, names
// the process holding the dir, and changes nothing: the first node's files
// keep their identity and it keeps serving what it acknowledged.
func TestSecondProcessOnDataDir(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	tc.MustTopic(t, n, "dd", nil)
	want := tc.MustPublish(t, n, "dd", "kept", nil)
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
		if name == "clock.json" || name == "clock.json.tmp" {
			// The running node itself replaces its clock record every
			// second (temp file, rename): its inode moves without help.
			continue
		}
		if after[name] != ino {
			t.Errorf("%s changed identity (inode %d → %d): the second process touched the running node's files", name, ino, after[name])
		}
	}
	msgs, err := tc.Drain(tc.CtxFor(t, 30*time.Second), n, "dd", "g", 300*time.Millisecond)
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

// A data dir records its node's id once the node is in its cluster's
// configuration under it. Started under another id, by --id or by the
// default (its raft address, as a copy of the dir on another host would
// be), it is refused at once, naming the recorded id: raft knows members
// by id, and the dir would sit in its cluster as a stranger, never voting,
// leading or ready, or, copied, stand in for the live member. A restored
// backup first started under the wrong id records nothing, so the right
// one still works. A new node's id must be one a URL and a log line carry
// as it is, and a refused one leaves no data dir behind.
func TestDataDirKeepsItsNodeID(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 90*time.Second)
	tc.MustTopic(t, n, "id", nil)
	want := tc.MustPublish(t, n, "id", "kept", nil)
	r, err := tc.DefaultClient.Do(ctx, "GET", n.URL()+"/v1/cluster/backup", nil, nil)
	if err != nil || r.Expect(200) != nil {
		t.Fatalf("backup: %v %v", err, r.Expect(200))
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(backup, r.Body, 0o600); err != nil {
		t.Fatal(err)
	}
	orig := n.Args()
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	noID := []string{}
	for i := 0; i < len(orig); i++ {
		if orig[i] == "--id" {
			i++
			continue
		}
		noID = append(noID, orig[i])
	}
	for _, args := range [][]string{append([]string{"--id", "other"}, noID...), noID} {
		out, err := systest.RunMqd(t, args...)
		if err == nil {
			t.Fatalf("data dir of %s started with %v: exit 0, want a refusal; output:\n%s", n.ID(), args, out)
		}
		if !strings.Contains(out, "--id "+n.ID()) {
			t.Errorf("the refusal does not name the recorded id (--id %s):\n%s", n.ID(), out)
		}
	}
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatalf("restarted with its own --id: %v", err)
	}
	if ci, err := n.Cluster(ctx); err != nil || ci.Self != n.ID() {
		t.Fatalf("restarted: serves as %q (%v), want %q", ci.Self, err, n.ID())
	}
	msgs, err := tc.Drain(ctx, n, "id", "g", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].Offset != want.Offset {
		t.Fatalf("after the restart: got %d messages, want the one published at offset %d", len(msgs), want.Offset)
	}

	rdir, raddr, rhttp := filepath.Join(t.TempDir(), "r"), freeLoopback(t), freeLoopback(t)
	if out, err := systest.RunMqd(t, "restore", "--data-dir", rdir, "--id", "r1", "--raft-addr", raddr, backup); err != nil {
		t.Fatalf("mqd restore: %v\n%s", err, out)
	}
	wrong := startMqd(t, "--id", "wrong", "--data-dir", rdir, "--http-addr", rhttp, "--raft-addr", raddr)
	waitURLStatus(ctx, t, "http://"+rhttp+"/healthz", 200)
	wrong()
	right := startMqd(t, "--id", "r1", "--data-dir", rdir, "--http-addr", rhttp, "--raft-addr", raddr)
	defer right()
	waitURLStatus(ctx, t, "http://"+rhttp+"/readyz", 200)

	fresh := filepath.Join(t.TempDir(), "fresh")
	out, err := systest.RunMqd(t, "--id", "a b", "--data-dir", fresh, "--http-addr", freeLoopback(t), "--raft-addr", freeLoopback(t))
	if err == nil || !strings.Contains(out, "invalid node id") {
		t.Fatalf("new node with id \"a b\": exit %v, want a refusal naming the invalid id; output:\n%s", err, out)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused id left its data dir behind (%v)", err)
	}
}

// startMqd starts the mqd binary with args in the background; the
// function returned stops it (SIGTERM, then SIGKILL after 10 s) and waits.
func startMqd(t *testing.T, args ...string) func() {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(tc.Binary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("mqd %v output:\n%s", args, out.String())
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitURLStatus polls url until it answers status; it fails the test when
// ctx ends first.
func waitURLStatus(ctx context.Context, t *testing.T, url string, status int) {
	t.Helper()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := tc.DefaultClient.Do(rctx, "GET", url, nil, nil)
		cancel()
		if err == nil && r.Status == status {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never answered %d (last: %v %v)", url, status, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
