package durability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestBackupRestore: a backup downloaded from a follower of a 3-node
// cluster, restored with `mqd restore` into a new data dir, starts a new
// one-node cluster that holds the state: every message the group had not
// acked (never fetched, or leased at backup time) is delivered, none it
// had acked is, an old idempotency key answers duplicate with its original
// position, and new publishes are applied and survive kill -9 and a
// restart (a restored state whose applied index the new raft log did not
// continue from would skip them). A second node then joins it.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	const topic, group = "orders", "billing"
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	tc.MustTopic(t, l, topic, map[string]any{"partitions": 2, "backoff_base_ms": 100, "backoff_jitter_ms": 0})
	orig := map[string]tc.PublishResult{}
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		orig[k] = tc.MustPublish(t, l, topic, "v-"+k, map[string]string{"Idempotency-Key": k})
	}
	// The group acks 6 messages and holds 4 leased; 10 are never fetched.
	ctx := tc.CtxFor(t, 60*time.Second)
	msgs, _, err := l.Fetch(ctx, topic, group, tc.FetchRequest{Max: 10, LeaseMs: 3000})
	if err != nil || len(msgs) != 10 {
		t.Fatalf("fetch: %d messages, %v; want 10", len(msgs), err)
	}
	acked := map[string]bool{}
	for _, m := range msgs[:6] {
		acked[m.IdempotencyKey] = true
	}
	if err := tc.AckAll(ctx, l, topic, group, msgs[:6]); err != nil {
		t.Fatal(err)
	}
	var info tc.ClusterInfo
	if err := getJSON(ctx, l, "/v1/cluster", &info); err != nil {
		t.Fatal(err)
	}
	// The follower's copy: wait until it applied the acks.
	f := fs[0]
	var body []byte
	var index uint64
	for {
		r, err := c.Client().Do(ctx, "GET", f.URL()+"/v1/cluster/backup", nil, nil)
		if err != nil || r.Expect(200) != nil {
			t.Fatalf("backup from %s: %v %v", f, err, r.Expect(200))
		}
		index, err = strconv.ParseUint(r.Header.Get("Mq-Applied-Index"), 10, 64)
		if err != nil {
			t.Fatalf("Mq-Applied-Index %q: %v", r.Header.Get("Mq-Applied-Index"), err)
		}
		if index >= info.CommitIndex {
			body = r.Body
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("follower's backup stays at index %d, below the acks' %d", index, info.CommitIndex)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(body) == 0 {
		t.Fatal("empty backup")
	}
	file := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
	c.KillAll()

	// Bad input changes nothing: not a backup, a data dir in use.
	bogus := filepath.Join(t.TempDir(), "bogus.db")
	if err := os.WriteFile(bogus, []byte("not a backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyDir := filepath.Join(t.TempDir(), "empty")
	if out, err := systest.RunMqd(t, "restore", "--data-dir", emptyDir, bogus); err == nil || !strings.Contains(out, "not an mqd backup") {
		t.Errorf("restore of a non-backup: %v, %q; want a failure naming it", err, out)
	}
	if ents, _ := os.ReadDir(emptyDir); len(ents) != 0 {
		t.Errorf("a failed restore left %d files in the data dir", len(ents))
	}
	if out, err := systest.RunMqd(t, "restore", "--data-dir", f.DataDir(), file); err == nil || !strings.Contains(out, "not empty") {
		t.Errorf("restore into a used data dir: %v, %q; want a refusal", err, out)
	}

	// Restore, then start a node on it: the harness calls the node-args
	// function before it starts the node, with the data dir and addresses
	// (and again for nodes added later, which join with empty dirs).
	rc := tc.Start(t, 1, tc.WithNodeArgs(func(n *tc.Node) []string {
		if n.ID() != "n1" {
			return nil
		}
		out, err := systest.RunMqd(t, "restore", "--data-dir", n.DataDir(), "--id", n.ID(), "--raft-addr", n.RaftAddr(), file)
		if err != nil || !strings.Contains(out, "raft index "+strconv.FormatUint(index, 10)) {
			t.Fatalf("mqd restore: %v\n%s", err, out)
		}
		return nil
	}))
	n := rc.Node(0)
	rctx := tc.CtxFor(t, 60*time.Second)
	want := map[string]bool{}
	for k := range orig {
		if !acked[k] {
			want[k] = true
		}
	}
	got := map[string]bool{}
	for len(got) < len(want) && rctx.Err() == nil {
		ms, _, err := n.Fetch(rctx, topic, group, tc.FetchRequest{Max: 100, WaitMs: 500, LeaseMs: 60000})
		if err != nil {
			t.Fatalf("fetch from the restored node: %v", err)
		}
		for _, m := range ms {
			switch {
			case acked[m.IdempotencyKey]:
				t.Errorf("%s was acked before the backup and is delivered again", m.IdempotencyKey)
			case got[m.IdempotencyKey]:
				t.Errorf("%s delivered twice", m.IdempotencyKey)
			case !want[m.IdempotencyKey]:
				t.Errorf("unexpected message %q", m.IdempotencyKey)
			}
			got[m.IdempotencyKey] = true
		}
		if len(ms) == 0 {
			continue
		}
		if err := tc.AckAll(rctx, n, topic, group, ms); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("restored node delivered %d of the %d unacked messages", len(got), len(want))
	}
	if ms, _, err := n.Fetch(rctx, topic, group, tc.FetchRequest{Max: 100, WaitMs: 500}); err != nil || len(ms) != 0 {
		t.Fatalf("after the unacked ones: %d more messages, %v", len(ms), err)
	}
	dup := tc.MustPublish(t, n, topic, "again", map[string]string{"Idempotency-Key": "k3"})
	if !dup.Duplicate || dup.Partition != orig["k3"].Partition || dup.Offset != orig["k3"].Offset {
		t.Errorf("re-publish of k3 on the restored node: %+v; want duplicate at %d/%d", dup, orig["k3"].Partition, orig["k3"].Offset)
	}

	// New publishes are applied, and survive kill -9.
	fresh := map[string]bool{}
	for i := range 5 {
		k := fmt.Sprintf("new%d", i)
		if pr := tc.MustPublish(t, n, topic, "v-"+k, map[string]string{"Idempotency-Key": k}); pr.Duplicate {
			t.Fatalf("new publish %s answered duplicate", k)
		}
		fresh[k] = true
	}
	n.Restart() // SIGKILL, then start on the same data dir
	if _, err := rc.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("restored node after kill -9: %v", err)
	}
	after, err := tc.Drain(tc.CtxFor(t, 30*time.Second), n, topic, group, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range after {
		keys = append(keys, m.IdempotencyKey)
	}
	if len(after) != len(fresh) {
		t.Fatalf("after kill -9: delivered %v, want the %d new messages", keys, len(fresh))
	}
	for _, k := range keys {
		if !fresh[k] {
			t.Errorf("after kill -9: delivered %s, not one of the new messages", k)
		}
	}
	if dup := tc.MustPublish(t, n, topic, "again", map[string]string{"Idempotency-Key": "new2"}); !dup.Duplicate {
		t.Errorf("re-publish of new2 after kill -9 is not a duplicate: %+v", dup)
	}

	// More nodes join the restored cluster and hold the same state.
	j := rc.AddNode("n2")
	if _, err := rc.WaitReady(tc.CtxFor(t, 30*time.Second)); err != nil {
		t.Fatalf("a node joining the restored cluster: %v", err)
	}
	var ci tc.ClusterInfo
	if err := getJSON(tc.CtxFor(t, 15*time.Second), j, "/v1/cluster", &ci); err != nil || len(ci.Nodes) != 2 {
		t.Fatalf("joined node's view of the cluster: %+v, %v; want 2 members", ci, err)
	}
}

// getJSON GETs path from n and decodes the 200 answer into v.
func getJSON(ctx context.Context, n *tc.Node, path string, v any) error {
	r, err := tc.DefaultClient.Do(ctx, "GET", n.URL()+path, nil, nil)
	if err != nil {
		return err
	}
	if err := r.Expect(200); err != nil {
		return err
	}
	return r.JSON(v)
}
