package cluster

import (
	"bufio"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// scripts/release.sh for the host's target, with GOFLAGS=-buildvcs=false
// as in many CI images: the binary's --version names the version and the
// commit stamped by the script's -ldflags (the build info then has no VCS
// settings), SHA256SUMS holds its checksum, and a linux binary is static
// (no ELF interpreter: CGO_ENABLED=0).
func TestReleaseScriptStampsVersion(t *testing.T) {
	t.Parallel()
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %s is not a git work tree: %v", root, err)
		}
		t.Skipf("not a git work tree (%v): the script stamps git's commit", err)
	}
	commit := strings.TrimSpace(string(head))
	if exec.Command("git", "-C", root, "diff", "--quiet", "HEAD", "--").Run() != nil {
		commit += "+dirty"
	}
	dist := t.TempDir()
	target := runtime.GOOS + "/" + runtime.GOARCH
	const version = "v0.0.0-releasetest.1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "release.sh"), version)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "MQD_RELEASE_TARGETS="+target, "MQD_RELEASE_DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/release.sh: %v\n%s", err, out)
	}
	name := "mqd-" + version + "-" + runtime.GOOS + "-" + runtime.GOARCH
	bin := filepath.Join(dist, name)
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", name, err)
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) < 3 || lines[0] != "mqd "+version || !strings.HasPrefix(lines[1], "commit "+commit+" (") ||
		!strings.HasPrefix(lines[2], runtime.Version()+" ") {
		t.Errorf("--version:\n%s\nwant mqd %s, commit %s (time), %s", out, version, commit, runtime.Version())
	}

	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	found := false
	for sc := bufio.NewScanner(strings.NewReader(string(sums))); sc.Scan(); {
		f := strings.Fields(sc.Text())
		found = found || len(f) == 2 && f[1] == name && f[0] == hex.EncodeToString(sum[:])
	}
	if !found {
		t.Errorf("SHA256SUMS lacks %s with its checksum:\n%s", name, sums)
	}

	if runtime.GOOS == "linux" {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has an ELF interpreter: not a static binary", name)
			}
		}
	}
}
