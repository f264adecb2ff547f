package testcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stopTimeout bounds a graceful stop before it escalates to SIGKILL.
const stopTimeout = 10 * time.Second

// Node is one mqd process of a Cluster. Its methods that start or stop the
// process must be called from the test's goroutine (they may call t.Fatal).
type Node struct {
	tb       testing.TB
	client   *Client
	id       string
	httpAddr string
	raftAddr string
	dataDir  string
	logPath  string
	args     []string
	env      []string
	scheme   string
	binary   string // "": Binary's

	mu     sync.Mutex
	proc   *process
	paused bool
	want   bool // the test wants it running: started and not killed or stopped since
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // cmd.Wait's answer; read only after done
	log  *os.File
}

// ID is the node's --id.
func (n *Node) ID() string { return n.id }

// HTTPAddr is the node's --http-addr (host:port).
func (n *Node) HTTPAddr() string { return n.httpAddr }

// RaftAddr is the node's --raft-addr (host:port).
func (n *Node) RaftAddr() string { return n.raftAddr }

// URL is the node's HTTP base URL, without a trailing slash.
func (n *Node) URL() string { return n.scheme + "://" + n.httpAddr }

// DataDir is the node's --data-dir.
func (n *Node) DataDir() string { return n.dataDir }

// LogPath is the file that collects the node's stdout and stderr across restarts.
func (n *Node) LogPath() string { return n.logPath }

// Args are the command-line arguments the node runs with.
func (n *Node) Args() []string { return append([]string(nil), n.args...) }

func (n *Node) String() string { return n.id + "@" + n.httpAddr }

// PID is the process id of the running process, or 0 if the node is not
// running.
func (n *Node) PID() int {
	p := n.current()
	if p == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// Running reports whether the process is started and has not exited.
func (n *Node) Running() bool {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Live reports whether the node is running and not paused.
func (n *Node) Live() bool {
	n.mu.Lock()
	paused := n.paused
	n.mu.Unlock()
	return !paused && n.Running()
}

// start launches the process; the node must not be running.
func (n *Node) start() error {
	if n.Running() {
		return fmt.Errorf("node %s is already running", n.id)
	}
	lf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "=== testcluster: %s start %s %s\n", time.Now().Format(time.RFC3339Nano), n.id, strings.Join(n.args, " "))
	n.mu.Lock()
	bin := n.binary
	n.mu.Unlock()
	if bin == "" {
		bin = Binary(n.tb)
	}
	cmd := exec.Command(bin, n.args...)
	if len(n.env) > 0 {
		cmd.Env = append(os.Environ(), n.env...)
	}
	cmd.Stdout = lf
	cmd.Stderr = lf
	// Own process group: terminal signals do not reach it. Pdeathsig: the node
	// dies with the test process even if cleanup never runs (panic, timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("starting node %s: %w", n.id, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{}), log: lf}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(lf, "=== testcluster: %s exit %s: %v\n", time.Now().Format(time.RFC3339Nano), n.id, exitString(p.err))
		lf.Close()
		close(p.done)
	}()
	n.mu.Lock()
	n.proc = p
	n.paused = false
	n.want = true
	n.mu.Unlock()
	return nil
}

func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (n *Node) current() *process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// signal sends sig to the running process; false if it is not running.
func (n *Node) signal(sig syscall.Signal) bool {
	p := n.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
	}
	return p.cmd.Process.Signal(sig) == nil
}

// kill sends SIGKILL and waits for the process to be reaped. No-op if not running.
func (n *Node) kill() {
	n.mu.Lock()
	n.want = false
	n.mu.Unlock()
	p := n.current()
	if p == nil {
		return
	}
	n.signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		n.tb.Errorf("node %s: not reaped 30s after SIGKILL", n.id)
	}
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
}

// Kill sends SIGKILL and waits until the process is gone.
func (n *Node) Kill() {
	n.tb.Helper()
	n.kill()
}

// Stop sends SIGTERM and waits up to 10 s for the process to exit, then
// escalates to SIGKILL. It returns nil only if the process exited with
// status 0 within the bound; the node is stopped either way.
func (n *Node) Stop() error {
	_, err := n.StopWithin(stopTimeout)
	return err
}

// StopWithin is Stop with a chosen bound; it also reports how long the exit took.
func (n *Node) StopWithin(d time.Duration) (time.Duration, error) {
	p := n.current()
	if p == nil || !n.Running() {
		return 0, fmt.Errorf("node %s is not running", n.id)
	}
	start := time.Now()
	n.signal(syscall.SIGTERM)
	n.mu.Lock()
	n.want = false
	if n.paused {
		n.paused = false
		p.cmd.Process.Signal(syscall.SIGCONT)
	}
	n.mu.Unlock()
	select {
	case <-p.done:
		took := time.Since(start)
		if p.err != nil {
			return took, fmt.Errorf("node %s after SIGTERM: %v", n.id, p.err)
		}
		return took, nil
	case <-time.After(d):
		n.kill()
		return time.Since(start), fmt.Errorf("node %s did not exit within %v of SIGTERM; killed", n.id, d)
	}
}

// Reload sends SIGHUP (re-read the auth file and certificates).
func (n *Node) Reload() {
	n.tb.Helper()
	if !n.signal(syscall.SIGHUP) {
		n.tb.Fatalf("reload %s: not running", n.id)
	}
}

// SetArgs replaces the node's command-line arguments for its next start.
func (n *Node) SetArgs(args []string) { n.args = append([]string(nil), args...) }

// Pause stops the process with SIGSTOP (it keeps its sockets but answers nothing).
func (n *Node) Pause() {
	n.tb.Helper()
	n.setPaused(syscall.SIGSTOP, true, "pause")
}

// Resume continues a paused process with SIGCONT.
func (n *Node) Resume() {
	n.tb.Helper()
	n.setPaused(syscall.SIGCONT, false, "resume")
}

func (n *Node) setPaused(sig syscall.Signal, paused bool, verb string) {
	n.tb.Helper()
	if !n.signal(sig) {
		n.tb.Fatalf("%s %s: not running", verb, n.id)
	}
	n.mu.Lock()
	n.paused = paused
	n.mu.Unlock()
}

// Restart starts the node again with the same command line. A node that is
// still running is killed (SIGKILL) first. It does not wait for readiness.
func (n *Node) Restart() {
	n.tb.Helper()
	n.kill()
	if err := n.start(); err != nil {
		n.tb.Fatalf("restart: %v", err)
	}
}

// SetEnv adds environment variables ("NAME=value") to the node's next
// starts (e.g. a test-only clock offset). The node must be stopped.
func (n *Node) SetEnv(kv ...string) {
	n.tb.Helper()
	if n.Running() {
		n.tb.Fatalf("setenv %s: node is running", n.id)
	}
	n.mu.Lock()
	n.env = append(append([]string(nil), n.env...), kv...)
	n.mu.Unlock()
}

// SetBinary makes the node's next starts run the mqd binary at path; ""
// is the one built from this repository (Binary). The node must be
// stopped: this is how a test upgrades a node in place.
func (n *Node) SetBinary(path string) {
	n.tb.Helper()
	if n.Running() {
		n.tb.Fatalf("setbinary %s: node is running", n.id)
	}
	n.mu.Lock()
	n.binary = path
	n.mu.Unlock()
}

// Wipe deletes the node's data directory. The node must be stopped.
func (n *Node) Wipe() {
	n.tb.Helper()
	if n.Running() {
		n.tb.Fatalf("wipe %s: node is running", n.id)
	}
	if err := os.RemoveAll(n.dataDir); err != nil {
		n.tb.Fatalf("wipe %s: %v", n.id, err)
	}
}

// ExitErr is the last process's exit error (nil for status 0), and whether it has exited.
func (n *Node) ExitErr() (error, bool) {
	p := n.current()
	if p == nil {
		return nil, false
	}
	select {
	case <-p.done:
		return p.err, true
	default:
		return nil, false
	}
}

// Do sends a request to path (e.g. "/v1/topics") on this node.
func (n *Node) Do(ctx context.Context, method, path string, body any, hdr map[string]string) (*Response, error) {
	return n.client.Do(ctx, method, n.URL()+path, body, hdr)
}

// DoHeader is Do with headers that may repeat.
func (n *Node) DoHeader(ctx context.Context, method, path string, body any, hdr http.Header) (*Response, error) {
	return n.client.DoHeader(ctx, method, n.URL()+path, body, hdr)
}

// Cluster fetches GET /v1/cluster from this node.
func (n *Node) Cluster(ctx context.Context) (ClusterInfo, error) {
	var ci ClusterInfo
	r, err := n.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
	if err != nil {
		return ci, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return ci, err
	}
	return ci, r.JSON(&ci)
}

// Ready reports whether GET /readyz answers 200.
func (n *Node) Ready(ctx context.Context) bool {
	r, err := n.Do(ctx, http.MethodGet, "/readyz", nil, nil)
	return err == nil && r.Status == http.StatusOK
}

// WaitReady polls /readyz until it answers 200 or ctx ends (30 s if ctx has no deadline).
func (n *Node) WaitReady(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if err := n.aliveErr(); err != nil {
			return err
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		ok := n.Ready(rctx)
		rcancel()
		if ok {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("node %s not ready: %w", n.id, err)
		}
	}
}

// crashed is non-nil if the process exited although the test did not stop it.
func (n *Node) crashed() error {
	n.mu.Lock()
	want := n.want
	n.mu.Unlock()
	if !want {
		return nil
	}
	return n.aliveErr()
}

// aliveErr is non-nil if the process has exited.
func (n *Node) aliveErr() error {
	if err, exited := n.ExitErr(); exited {
		return fmt.Errorf("node %s exited: %s", n.id, exitString(err))
	}
	return nil
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Client is the HTTP client this node's helpers use.
func (n *Node) Client() *Client { return n.client }
