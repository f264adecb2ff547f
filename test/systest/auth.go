package systest

import (
	"testing"

	tc "github.com/mqd/mqd/internal/testcluster"
)

var AuthRoles = map[string][]string{
	"node":    {"cluster"},
	"ops":     {"monitor", "admin:*"}, // the harness's own token
	"monitor": {"monitor"},
	"pub":     {"publish:orders*"},
	"cons":    {"consume:orders*"},
	"admin":   {"admin:orders*"},
	"other":   {"publish:invoices", "consume:invoices", "admin:invoices", "monitor"},
}

// ExpectError checks status and JSON error code.
func ExpectError(t *testing.T, what string, r *tc.Response, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: %d %s, want %d", what, r.Status, r.Body, status)
		return
	}
	got, err := r.CheckError()
	if err != nil || got != code {
		t.Errorf("%s: code %q (%v), want %q", what, got, err, code)
	}
}
