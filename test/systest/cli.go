package systest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// CliRun is one run of the mqd binary as a client.
type CliRun struct {
	Stdout, Stderr string
	Code           int
}

// RunCLI runs `mqd args...` with MQD_SERVER=server (unless empty) and stdin,
// bounded by 60 s.
func RunCLI(t *testing.T, server, stdin string, args ...string) CliRun {
	t.Helper()
	return RunCLIEnv(t, []string{"MQD_SERVER=" + server, "MQD_TOKEN="}, stdin, args...)
}

// RunCLIEnv runs `mqd args...` with env added to the test's environment.
func RunCLIEnv(t *testing.T, env []string, stdin string, args ...string) CliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tc.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := CliRun{Stdout: out.String(), Stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case err != nil:
		t.Fatalf("mqd %v: %v", args, err)
	}
	return r
}

// OK runs a command that must succeed and returns its stdout.
func OK(t *testing.T, server, stdin string, args ...string) string {
	t.Helper()
	r := RunCLI(t, server, stdin, args...)
	if r.Code != 0 {
		t.Fatalf("mqd %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// Fails runs a command that must exit with code and say want on stderr.
func Fails(t *testing.T, server string, code int, want string, args ...string) {
	t.Helper()
	r := RunCLI(t, server, "", args...)
	if r.Code != code || !strings.Contains(r.Stderr, want) {
		t.Errorf("mqd %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(args, " "), r.Code, r.Stderr, code, want)
	}
}

func MustContain(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("%s: %q lacks %q", what, got, w)
		}
	}
}

// RunMqd runs the mqd binary with args and returns its combined output.
func RunMqd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tc.Binary(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
