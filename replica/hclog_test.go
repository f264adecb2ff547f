package replica

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Raft's per-attempt peer failures are debug, its routine election lines
// info, and a repeated warning is logged once per repeatWindow with the
// count of the ones held back.
func TestHclogAdapter(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a := NewHclog(l, "raft").(*hclogAdapter)
	now := time.Unix(1000, 0)
	a.rep.now = func() time.Time { return now }

	for range 50 {
		a.Error("failed to heartbeat to", "peer", "n2", "error", errors.New("connection refused"))
		a.Warn("failed to contact", "server-id", "n2")
	}
	a.Info("entering follower state", "follower", "n1")
	// Routine on a hand-off, a stop, a catch-up from a snapshot.
	a.Error("failed to get log", "index", 1, "error", errors.New("log not found"))
	a.Error("failed to decode incoming command", "error", errors.New("transport shutdown"))
	if buf.Len() != 0 {
		t.Fatalf("peer retries and raft info lines reached info level:\n%s", buf.String())
	}
	for range 5 {
		a.Warn("heartbeat timeout reached, starting election", "last-leader-id", "n3")
	}
	a.Error("failed to take snapshot", "error", errors.New("disk"))
	a.Error("failed to take snapshot", "error", errors.New("disk"))
	a.Error("peer has newer term, stopping replication", "peer", "n2")
	a.Error("failed to decode incoming command", "error", errors.New("unknown rpc type 9"))
	out := buf.String()
	if !strings.Contains(out, `level=INFO msg="peer has newer term`) || !strings.Contains(out, `level=ERROR msg="failed to decode incoming command" component=raft error="unknown rpc type 9"`) {
		t.Errorf("a superseded leader should log at info, a real decode failure at error:\n%s", out)
	}
	if n := strings.Count(out, "starting election"); n != 1 || !strings.Contains(out, "level=INFO msg=\"heartbeat timeout") {
		t.Errorf("election line: %d times, want once at info:\n%s", n, out)
	}
	if n := strings.Count(out, "failed to take snapshot"); n != 1 || !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "error=disk") {
		t.Errorf("repeated error: %d times, want once at error with its error text:\n%s", n, out)
	}
	now = now.Add(repeatWindow)
	a.Error("failed to take snapshot", "error", errors.New("disk"))
	if !strings.Contains(buf.String(), "repeated=1") {
		t.Errorf("after the window the line should say how many were held back:\n%s", buf.String())
	}
	if !strings.Contains(out, "component=raft") {
		t.Errorf("raft lines should carry component=raft:\n%s", out)
	}
}
