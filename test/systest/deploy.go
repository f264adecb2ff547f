package systest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// ServerFlagSet is the server's flags by `mqd serve --help`: name → whether
// it takes a value (a boolean flag has no TYPE after its name).
func ServerFlagSet(t *testing.T) map[string]bool {
	t.Helper()
	r := RunCLI(t, "", "", "serve", "--help")
	if r.Code != 0 {
		t.Fatalf("mqd serve --help: exit %d: %s", r.Code, r.Stderr)
	}
	flags := map[string]bool{}
	line := regexp.MustCompile(`^  --([a-z0-9-]+)( \S+)?$`)
	for _, l := range strings.Split(r.Stdout, "\n") {
		if m := line.FindStringSubmatch(l); m != nil {
			flags[m[1]] = m[2] != ""
		}
	}
	if len(flags) < 20 || !flags["http-addr"] || flags["insecure"] {
		t.Fatalf("mqd serve --help: parsed %v, not the server's flags", flags)
	}
	return flags
}

// ParseServeArgs checks a command line against the server's flags (an
// optional leading "serve", then --flag [value] pairs) and returns the
// flags' values ("true" for a boolean).
func ParseServeArgs(t *testing.T, what string, flags map[string]bool, args []string) map[string]string {
	t.Helper()
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	got := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			t.Errorf("%s: %q is not a flag (args %q)", what, a, args)
			continue
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		takesValue, ok := flags[name]
		switch {
		case !ok:
			t.Errorf("%s: --%s is not a flag of mqd serve", what, name)
		case takesValue && !hasValue:
			if i+1 >= len(args) || strings.HasPrefix(args[i+1], "--") {
				t.Errorf("%s: --%s has no value", what, name)
				continue
			}
			i++
			value = args[i]
		case !takesValue && !hasValue:
			value = "true"
		}
		got[name] = value
	}
	return got
}

// CheckEnvNames checks that each MQD_ variable names a server flag.
func CheckEnvNames(t *testing.T, what string, flags map[string]bool, names []string) {
	t.Helper()
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, "MQD_"); ok {
			if _, ok := flags[strings.ReplaceAll(strings.ToLower(rest), "_", "-")]; !ok {
				t.Errorf("%s: %s sets no flag of mqd serve", what, n)
			}
		}
	}
}

func RepoFile(t *testing.T, path string) []byte {
	t.Helper()
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func Port(t *testing.T, what, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s: %q is not host:port", what, addr)
	}
	return p
}

// WaitHTTP200 polls url until it answers 200 or ctx ends.
func WaitHTTP200(ctx context.Context, url string) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
		r, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", url, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
