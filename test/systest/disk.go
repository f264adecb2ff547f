package systest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// ExpectCode checks a response's status and error code.
func ExpectCode(t *testing.T, what string, r *tc.Response, err error, status int, code string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: no answer: %v", what, err)
	}
	if r.Status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, r.Status, status, r.Body)
	}
	if code == "" {
		return
	}
	got, cerr := r.CheckError()
	if cerr != nil || got != code {
		t.Fatalf("%s: error code %q (%v), want %q: %s", what, got, cerr, code, r.Body)
	}
}

// WaitMetric polls n's /metrics until the unlabelled gauge name satisfies ok.
func WaitMetric(ctx context.Context, n *tc.Node, name string, ok func(float64) bool) error {
	last := "never read"
	for {
		r, err := n.Do(ctx, http.MethodGet, "/metrics", nil, nil)
		if err == nil && r.Status == 200 {
			for _, line := range strings.Split(string(r.Body), "\n") {
				// The series of name, with or without labels (the raft
				// metrics carry raft_group).
				if series, v, found := strings.Cut(line, " "); found && (series == name || strings.HasPrefix(series, name+"{")) {
					last = v
					if f, err := strconv.ParseFloat(v, 64); err == nil && ok(f) {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("metric %s on %s: last %s: %w", name, n, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
