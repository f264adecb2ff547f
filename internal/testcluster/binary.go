package testcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildPath string
	buildErr  error
)

// RaceEnv, set to a non-empty value, builds the binary with the race
// detector; every cluster then fails its test if a node reported a data
// race (checked in the cluster's cleanup).
const RaceEnv = "MQD_TEST_RACE"

// Race reports whether the binary is built with the race detector.
func Race() bool { return os.Getenv(RaceEnv) != "" }

// Binary returns the path of an mqd binary built from this repository's
// ./cmd/mqd. The build happens once per test process; later calls reuse it.
// Setting MQD_TEST_BINARY uses that prebuilt binary instead.
//
// The built file is named "brokertest" in a "systest-bin-*" directory, on
// purpose without "mqd" in its path: a developer's `pkill mqd` (or
// `pkill -f mqd`) aimed at a hand-started cluster then leaves test clusters
// alone.
func Binary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(build)
	if buildErr != nil {
		tb.Fatalf("testcluster: %v", buildErr)
	}
	return buildPath
}

// Main runs the tests of a package and removes the built binary afterwards.
// Use it from TestMain: func TestMain(m *testing.M) { testcluster.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func build() {
	if p := os.Getenv("MQD_TEST_BINARY"); p != "" {
		buildPath = p
		// A prebuilt binary from before data groups has no flag to
		// turn them off (cluster.go, defaultFlags).
		out, _ := exec.Command(p, "-h").CombinedOutput()
		noDataGroupsFlag = !strings.Contains(string(out), "-data-groups")
		return
	}
	root, err := RepoRoot()
	if err != nil {
		buildErr = err
		return
	}
	dir, err := os.MkdirTemp("", "systest-bin-")
	if err != nil {
		buildErr = err
		return
	}
	buildDir = dir
	out := filepath.Join(dir, "brokertest")
	args := []string{"build", "-o", out}
	if Race() {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/mqd")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("go build ./cmd/mqd: %v\n%s", err, b)
		return
	}
	buildPath = out
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// BuildAt builds ./cmd/mqd as it was at commit (an older release, for
// upgrade tests) into a directory tb removes, and returns the binary's
// path. It skips tb when the repository's history does not hold commit (a
// shallow clone or a source archive): the old source is taken from git.
func BuildAt(tb testing.TB, commit string) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		tb.Skipf("testcluster: commit %s is not in this checkout's history (%v %s): cannot build the older binary", commit, err, out)
	}
	dir := tb.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		tb.Fatal(err)
	}
	tarball := filepath.Join(dir, "src.tar")
	for _, c := range [][]string{
		{"git", "-C", root, "archive", "--format=tar", "-o", tarball, commit},
		{"tar", "-xf", tarball, "-C", src},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			tb.Fatalf("testcluster: %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	bin := filepath.Join(dir, "brokertest-"+commit)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/mqd")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("testcluster: go build ./cmd/mqd at %s: %v\n%s", commit, err, out)
	}
	return bin
}
