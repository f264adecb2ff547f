package ops

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// scripts/cluster.sh on free ports: start forms the cluster; kill and
// restart take one node down and back; a pid file naming a process that is
// not its node (a reused pid) is never signalled; stop ends every node.
func TestClusterScript(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set and curl is missing (scripts/cluster.sh needs it)")
		}
		t.Skip("no curl: scripts/cluster.sh polls /readyz with it")
	}
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	var httpPorts, raftPorts []string
	for range 3 {
		for _, ports := range []*[]string{&httpPorts, &raftPorts} {
			a, err := tc.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			_, p, _ := net.SplitHostPort(a)
			*ports = append(*ports, p)
		}
	}
	env := append(os.Environ(), "MQD_CLUSTER_DATA="+data, "MQD_CLUSTER_BIN="+tc.Binary(t),
		"MQD_CLUSTER_HTTP_PORTS="+strings.Join(httpPorts, " "), "MQD_CLUSTER_RAFT_PORTS="+strings.Join(raftPorts, " "))
	script := func(args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "cluster.sh"), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("cluster.sh %v: %v", args, err)
		}
		return string(out), code
	}
	pid := func(node string) int {
		b, err := os.ReadFile(filepath.Join(data, node+".pid"))
		if err != nil {
			return 0
		}
		p, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return p
	}
	alive := func(p int) bool { return p > 0 && syscall.Kill(p, 0) == nil }
	pids := map[string]int{}
	t.Cleanup(func() {
		for _, p := range pids { // whatever a failed test left running
			if alive(p) {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	ready := func(i int) bool {
		r, err := http.Get("http://127.0.0.1:" + httpPorts[i] + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	}

	if out, code := script("start"); code != 0 || !strings.Contains(out, "cluster up") {
		t.Fatalf("start: exit %d\n%s", code, out)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if pids[n] = pid(n); !alive(pids[n]) {
			t.Fatalf("%s: pid file %d, not a live process", n, pids[n])
		}
	}
	if out, code := script("status"); code != 0 || !strings.Contains(out, `"n3"`) {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if out, code := script("kill", "n2"); code != 0 || alive(pids["n2"]) {
		t.Fatalf("kill n2: exit %d, pid %d alive %v\n%s", code, pids["n2"], alive(pids["n2"]), out)
	}
	if out, code := script("restart", "n2"); code != 0 || !strings.Contains(out, "n2 ready") || !ready(1) {
		t.Fatalf("restart n2: exit %d\n%s", code, out)
	}
	pids["n2"] = pid("n2")

	// n3's pid file now names another process: stop must leave it alone
	// (and n3 then still runs: its pid file no longer finds it).
	stranger := exec.Command("sleep", "60")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stranger.Process.Kill(); stranger.Wait() }()
	if err := os.WriteFile(filepath.Join(data, "n3.pid"), []byte(strconv.Itoa(stranger.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := script("stop")
	if code != 0 || !strings.Contains(out, "not n3") {
		t.Errorf("stop with a stale n3 pid file: exit %d\n%s", code, out)
	}
	if err := stranger.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("stop signalled the process a stale pid file named: %v", err)
	}
	for _, n := range []string{"n1", "n2"} {
		if alive(pids[n]) {
			t.Errorf("%s (pid %d) still runs after stop", n, pids[n])
		}
	}
	if !alive(pids["n3"]) {
		t.Errorf("n3 (pid %d) stopped: a stale pid file cannot have found it", pids["n3"])
	}
	syscall.Kill(pids["n3"], syscall.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); alive(pids["n3"]) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if out, code := script("kill", "n9"); code != 2 || !strings.Contains(out, "usage") {
		t.Errorf("kill n9: exit %d\n%s", code, out)
	}
}
