package durability

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// startedAt matches the line a node logs when raft starts at the applied
// index of fsm.db rather than at its latest snapshot.
var startedAt = regexp.MustCompile(`raft starts at the state's applied index.* applied_index=(\d+) latest_snapshot_index=(\d+) configuration_index=(\d+)`)

// After kill -9, a node's raft starts at fsm.db's applied index: the log
// before it is not read again (replica/startsnap.go). The configuration
// raft then starts with comes from the state, not from the log: after a
// node was removed, the restarted nodes must know the two-voter
// configuration, elect a leader between the two of them (with the removed
// node's vote counted they could not) and keep every acknowledged message.
func TestRestartStartsAtStateAfterMembershipChange(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3, tc.WithSnapshot(1000000, time.Hour, 50)) // no snapshot: the whole log is behind the state
	ctx := tc.CtxFor(t, 120*time.Second)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "rs", nil)
	var keys []string
	publish := func(n *tc.Node, prefix string, count int) {
		for i := range count {
			k := fmt.Sprintf("%s-%d", prefix, i)
			if _, err := systest.PublishRetry(ctx, []*tc.Node{n}, "rs", k); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
	}
	publish(leader, "before", 20)
	gone, f := followers[0], followers[1]
	r, err := leader.Do(ctx, http.MethodDelete, "/v1/cluster/nodes/"+gone.ID(), nil, nil)
	systest.ExpectCode(t, "remove a follower", r, err, 200, "")
	gone.Kill()
	two := map[string]bool{leader.ID(): true, f.ID(): true}
	if _, err := tc.WaitView(ctx, leader, "two healthy voters", systest.Healthy(two)); err != nil {
		t.Fatal(err)
	}
	publish(leader, "after", 20)
	ci, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range []*tc.Node{f, leader} {
		if _, err := tc.WaitView(ctx, n, "everything applied", func(v tc.ClusterInfo) bool { return v.AppliedIndex >= ci.CommitIndex }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // a checkpoint of fsm.db after the last apply (about one a second)
		from := fileLen(t, n.LogPath())
		n.Kill()
		n.Restart()
		if err := n.WaitReady(ctx); err != nil {
			t.Fatalf("%s after kill -9 and restart: %v", n, err)
		}
		m := startedAt.FindStringSubmatch(logSince(t, n.LogPath(), from))
		if m == nil {
			t.Fatalf("%s: no %q line after the restart", n, "raft starts at the state's applied index")
		}
		applied, _ := strconv.ParseUint(m[1], 10, 64)
		snap, _ := strconv.ParseUint(m[2], 10, 64)
		confIdx, _ := strconv.ParseUint(m[3], 10, 64)
		if snap != 0 || applied <= confIdx || confIdx <= 1 {
			t.Fatalf("%s started at applied index %d, snapshot %d, configuration index %d: want the removal's configuration (past the bootstrap's, index 1) below the applied index, no snapshot",
				n, applied, snap, confIdx)
		}
		if _, err := tc.WaitView(ctx, n, "the two voters after its restart", systest.Healthy(two)); err != nil {
			t.Fatal(err)
		}
	}
	tc.MustLeader(t, c)
	publish(f, "restarted", 5)
	msgs, err := tc.Drain(ctx, f, "rs", "g", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, v := range systest.Values(t, msgs) {
		got[v] = true
	}
	for _, k := range keys {
		if !got[k] {
			t.Fatalf("acknowledged %s missing after the restarts (%d of %d there)", k, len(got), len(keys))
		}
	}
}

func fileLen(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// logSince is what the node's log holds from offset from on.
func logSince(t *testing.T, path string, from int64) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[from:])
}
