package ops

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
	"go.yaml.in/yaml/v3"
)

// dockerfile is what the test reads of deploy/Dockerfile: its final
// stage's ENV and EXPOSE.
type dockerfile struct {
	env    map[string]string
	expose []string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	d := dockerfile{env: map[string]string{}}
	var logical []string
	cur := ""
	for sc := bufio.NewScanner(strings.NewReader(string(systest.RepoFile(t, "deploy/Dockerfile")))); sc.Scan(); {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur += s + " "
			continue
		}
		logical, cur = append(logical, cur+l), ""
	}
	for _, l := range logical {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			d = dockerfile{env: map[string]string{}} // the final stage counts
		case "ENV":
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				d.env[k] = v
			}
		case "EXPOSE":
			d.expose = append(d.expose, f[1:]...)
		}
	}
	return d
}

// The image's defaults listen on every interface, on the ports it
// exposes, through variables that are server flags; .dockerignore keeps
// binaries, data dirs, dist/ and .git out of the build context.
func TestDeployDockerfile(t *testing.T) {
	t.Parallel()
	flags := systest.ServerFlagSet(t)
	d := readDockerfile(t)
	systest.CheckEnvNames(t, "deploy/Dockerfile ENV", flags, slices.Collect(mapKeys(d.env)))
	for _, name := range []string{"MQD_HTTP_ADDR", "MQD_RAFT_ADDR"} {
		host, p, err := net.SplitHostPort(d.env[name])
		if err != nil || host != "0.0.0.0" || !slices.Contains(d.expose, p) {
			t.Errorf("deploy/Dockerfile: %s=%q, EXPOSE %v: want 0.0.0.0:PORT with PORT exposed", name, d.env[name], d.expose)
		}
	}
	if d.env["MQD_DATA_DIR"] == "" || d.env["MQD_RAFT_ADVERTISE_ADDR"] != "" {
		t.Errorf("deploy/Dockerfile ENV %v: want MQD_DATA_DIR, and the advertise address left to its host-name default", d.env)
	}
	ignored := strings.Fields(string(systest.RepoFile(t, ".dockerignore")))
	for _, want := range []string{".git", "dist", "/mqd", "/mqd-data", "/cluster-data", "**/*.test"} {
		if !slices.Contains(ignored, want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

type composeFile struct {
	Services map[string]struct {
		Hostname string   `yaml:"hostname"`
		Command  []string `yaml:"command"`
		Ports    []string `yaml:"ports"`
		Volumes  []string `yaml:"volumes"`
	} `yaml:"services"`
}

// deploy/compose.yaml: every node's command line is made of server flags;
// the ids, advertised addresses and join list name the services; and the
// three command lines, run as processes on 127.0.0.1 (each service name
// and listen address replaced by a free port of 127.0.0.1, the data dir
// by a temporary one, with the image's ENV), form a cluster: every node
// ready, one leader, three voters.
func TestDeployComposeCluster(t *testing.T) {
	t.Parallel()
	flags := systest.ServerFlagSet(t)
	d := readDockerfile(t)
	var cf composeFile
	if err := yaml.Unmarshal(systest.RepoFile(t, "deploy/compose.yaml"), &cf); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range cf.Services {
			if !yield(n) {
				return
			}
		}
	})
	if len(names) != 3 {
		t.Fatalf("deploy/compose.yaml: services %v, want three nodes", names)
	}
	values := map[string]map[string]string{}
	for _, n := range names {
		s := cf.Services[n]
		v := systest.ParseServeArgs(t, "compose "+n, flags, s.Command)
		values[n] = v
		httpPort, raftPort := systest.Port(t, n, v["http-addr"]), systest.Port(t, n, v["raft-addr"])
		var joins []string
		for _, m := range names {
			joins = append(joins, m+":"+httpPort)
		}
		switch {
		case v["id"] != n || s.Hostname != n:
			t.Errorf("compose %s: --id %q, hostname %q: want the service name", n, v["id"], s.Hostname)
		case v["http-advertise-addr"] != n+":"+httpPort || v["raft-advertise-addr"] != n+":"+raftPort:
			t.Errorf("compose %s: advertises %q, %q: want its service name with the listen ports", n, v["http-advertise-addr"], v["raft-advertise-addr"])
		case v["join"] != strings.Join(joins, ","):
			t.Errorf("compose %s: --join %q, want %q", n, v["join"], strings.Join(joins, ","))
		case v["bootstrap-expect"] != strconv.Itoa(len(names)):
			t.Errorf("compose %s: --bootstrap-expect %q, want %d", n, v["bootstrap-expect"], len(names))
		case len(s.Ports) != 1 || !strings.HasSuffix(s.Ports[0], ":"+httpPort):
			t.Errorf("compose %s: ports %v, want the HTTP port %s published", n, s.Ports, httpPort)
		case len(s.Volumes) != 1 || !strings.HasSuffix(s.Volumes[0], ":"+d.env["MQD_DATA_DIR"]):
			t.Errorf("compose %s: volumes %v, want one on the image's data dir %s", n, s.Volumes, d.env["MQD_DATA_DIR"])
		}
	}
	if t.Failed() {
		return
	}

	// The same command lines as processes here.
	addr := map[string]string{} // "n1:7070" → "127.0.0.1:PORT"
	for _, n := range names {
		for _, f := range []string{"http-advertise-addr", "raft-advertise-addr"} {
			a, err := tc.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			addr[values[n][f]] = a
		}
	}
	dir := t.TempDir()
	var procs []*exec.Cmd
	t.Cleanup(func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			done := make(chan struct{})
			go func() { p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				p.Process.Kill()
				<-done
			}
		}
	})
	urls := map[string]string{}
	for _, n := range names {
		own := map[string]string{ // this node's listen addresses
			values[n]["http-addr"]: addr[values[n]["http-advertise-addr"]],
			values[n]["raft-addr"]: addr[values[n]["raft-advertise-addr"]],
		}
		var args []string
		for _, a := range cf.Services[n].Command {
			if r, ok := own[a]; ok {
				a = r
			}
			for from, to := range addr {
				a = strings.ReplaceAll(a, from, to)
			}
			args = append(args, a)
		}
		env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		for k, v := range d.env {
			if k == "MQD_DATA_DIR" {
				v = filepath.Join(dir, n)
			}
			env = append(env, k+"="+v)
		}
		log, err := os.Create(filepath.Join(dir, n+".log"))
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		cmd := exec.Command(tc.Binary(t), args...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
		urls[n] = "http://" + addr[values[n]["http-advertise-addr"]]
		t.Logf("%s: mqd %s", n, strings.Join(args, " "))
	}
	ctx := tc.CtxFor(t, 90*time.Second)
	for _, n := range names {
		if err := systest.WaitHTTP200(ctx, urls[n]+"/readyz"); err != nil {
			for _, m := range names {
				b, _ := os.ReadFile(filepath.Join(dir, m+".log"))
				t.Logf("---- %s log ----\n%s", m, b)
			}
			t.Fatalf("%s not ready: %v", n, err)
		}
	}
	var ci tc.ClusterInfo
	if err := json.Unmarshal([]byte(systest.OK(t, urls[names[0]], "", "cluster", "status", "--json")), &ci); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, n := range ci.Nodes {
		if n.Voter {
			ids = append(ids, n.ID)
		}
	}
	slices.Sort(ids)
	if ci.Leader == nil || !slices.Equal(ids, names) {
		t.Errorf("cluster status: leader %v, voters %v; want a leader and voters %v", ci.Leader, ids, names)
	}
	// Any node takes a write: a follower forwards it to the leader's advertised address.
	for _, n := range names {
		systest.OK(t, urls[n], "", "topic", "create", "t-"+n)
	}
}
