package ops

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// readmeBlocks returns the ```sh blocks of README.md under the heading
// that starts with heading, in order.
func readmeBlocks(t *testing.T, heading string) []string {
	t.Helper()
	var blocks []string
	in, cur := false, []string(nil)
	section := ""
	for sc := bufio.NewScanner(strings.NewReader(string(systest.RepoFile(t, "README.md")))); sc.Scan(); {
		l := sc.Text()
		switch {
		case !in && strings.HasPrefix(l, "## "):
			section = l
		case !in && l == "```sh":
			in, cur = true, nil
		case in && l == "```":
			in = false
			if strings.HasPrefix(section, "## "+heading) {
				blocks = append(blocks, strings.Join(cur, "\n"))
			}
		case in:
			cur = append(cur, l)
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("README.md: no sh block under a heading %q", heading)
	}
	return blocks
}

// A readmeStep is one command of a block (its continuation lines joined)
// and the output the README shows under it: the "# " lines that follow it
// directly (none: not compared).
type readmeStep struct {
	command string
	want    []string
}

func readmeSteps(block string) []readmeStep {
	var steps []readmeStep
	lines := strings.Split(block, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		cmd := l
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd += "\n" + lines[i]
		}
		st := readmeStep{command: cmd}
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "# ") {
			i++
			st.want = append(st.want, strings.TrimPrefix(lines[i], "# "))
		}
		steps = append(steps, st)
	}
	return steps
}

// readmeLine matches a line of output against the README's: "…" or
// "..." stand for any text.
func readmeLine(want, got string) bool {
	parts := regexp.MustCompile(`…|\.\.\.`).Split(want, -1)
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`).MatchString(got)
}

// runReadmeSteps runs the steps as one bash script in dir (so variables
// and background jobs carry over, as when pasted into one shell), each
// followed by a marker with its exit status, and checks each exits 0 and
// prints what the README shows under it.
func runReadmeSteps(t *testing.T, what, dir string, env []string, steps []readmeStep, timeout time.Duration) {
	t.Helper()
	var script strings.Builder
	for i, st := range steps {
		fmt.Fprintf(&script, "%s\nprintf '\\n@@step %d exit %%d@@\\n' $?\n", st.command, i)
	}
	out, err := os.Create(filepath.Join(dir, what+".out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	errOut, err := os.Create(filepath.Join(dir, what+".err"))
	if err != nil {
		t.Fatal(err)
	}
	defer errOut.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, errOut
	// Its own process group: what it started in the background (the
	// walk-through's broker) ends with it whatever happens.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	runErr := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	if runErr != nil {
		stderr, _ := os.ReadFile(errOut.Name())
		t.Errorf("%s: bash: %v\nstderr:\n%s", what, runErr, stderr)
	}
	marker := regexp.MustCompile(`\n@@step (\d+) exit (\d+)@@\n`)
	text := string(b)
	next := 0
	for _, m := range marker.FindAllStringSubmatchIndex(text, -1) {
		i, _ := strconv.Atoi(text[m[2]:m[3]])
		code := text[m[4]:m[5]]
		seg := text[next:m[0]]
		next = m[1]
		if i >= len(steps) {
			break
		}
		st := steps[i]
		if code != "0" {
			t.Errorf("%s: %q exited %s:\n%s", what, st.command, code, seg)
			continue
		}
		if st.want == nil {
			continue
		}
		got := strings.Split(strings.TrimLeft(seg, "\n"), "\n")
		for len(got) > 0 && got[len(got)-1] == "" {
			got = got[:len(got)-1]
		}
		// Stdout only (sub's account of what it did goes to stderr).
		same := len(got) == len(st.want)
		for j := 0; same && j < len(got); j++ {
			same = readmeLine(st.want[j], got[j])
		}
		if !same {
			t.Errorf("%s: %q printed\n%s\nwant (README.md)\n%s", what, st.command, strings.Join(got, "\n"), strings.Join(st.want, "\n"))
		}
	}
	if n := len(marker.FindAllString(text, -1)); n != len(steps) {
		t.Errorf("%s: %d of %d steps ran; output:\n%s", what, n, len(steps), text)
	}
}

// The README's tour and its curl walk-through, as written and in order,
// on a fresh copy of the repository: the tour with `mqd` on PATH against
// the broker of the README's first command (`go run ./cmd/mqd`: the built
// binary with no flags), then the walk-through, which builds ./mqd and
// starts its own broker. What the README shows under a command is what
// it prints. The listen ports are the test's own (MQD_HTTP_ADDR and
// MQD_SERVER for the tour, the walk-through's 7080/7081 replaced), so
// that the test can run next to anything.
func TestReadme(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq", "base64", "git", "seq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI is set and %s is missing (the README's blocks need it)", tool)
			}
			t.Skipf("no %s: the README's blocks need it", tool)
		}
	}
	tour := readmeSteps(readmeBlocks(t, "A one-minute tour")[0])
	walk := readmeSteps(strings.Join(readmeBlocks(t, "Walk-through with curl"), "\n"))

	// A fresh directory holding the repository's files (tracked, and new
	// ones not ignored), for the walk-through's `go build ./cmd/mqd`.
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and git ls-files fails in %s: %v", root, err)
		}
		t.Skipf("not a git work tree (git ls-files: %v): the fresh copy is made of its files", err)
	}
	dir := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		if err := copyFile(filepath.Join(root, f), filepath.Join(dir, f)); err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			t.Fatal(err)
		}
	}
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tc.Binary(t), filepath.Join(bin, "mqd")); err != nil {
		t.Fatal(err)
	}
	addrs := make([]string, 4)
	for i := range addrs {
		if addrs[i], err = tc.FreeAddr(); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MQD_") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GOFLAGS=-trimpath") // the build cache's packages, whatever the directory

	// The tour's broker: `go run ./cmd/mqd` in the fresh directory.
	srvEnv := append(env, "MQD_HTTP_ADDR="+addrs[0], "MQD_RAFT_ADDR="+addrs[1])
	log, err := os.Create(filepath.Join(dir, "tour-broker.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	srv := exec.Command(tc.Binary(t))
	srv.Dir, srv.Env, srv.Stdout, srv.Stderr = dir, srvEnv, log, log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() }()
	ctx := tc.CtxFor(t, 60*time.Second)
	if err := systest.WaitHTTP200(ctx, "http://"+addrs[0]+"/readyz"); err != nil {
		t.Fatalf("the tour's broker: %v", err)
	}
	runReadmeSteps(t, "tour", dir, append(env, "MQD_SERVER=http://"+addrs[0]), tour, 3*time.Minute)

	_, walkHTTP, _ := strings.Cut(addrs[2], ":")
	_, walkRaft, _ := strings.Cut(addrs[3], ":")
	for i := range walk {
		walk[i].command = strings.NewReplacer(":7080", ":"+walkHTTP, ":7081", ":"+walkRaft).Replace(walk[i].command)
	}
	runReadmeSteps(t, "walk-through", dir, env, walk, 4*time.Minute)
	for _, d := range []string{"mqd-data", "walk-data"} {
		if _, err := os.Stat(filepath.Join(dir, d)); err != nil {
			t.Errorf("data dir %s: %v (the tour and the walk-through keep their own)", d, err)
		}
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil || st.IsDir() {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
