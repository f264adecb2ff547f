package durability

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestBackupDataGroups: a backup of a 3-node --data-groups cluster with
// auth on, taken through one node, holds every topic: the three groups of three it holds
// a replica of and a single-replica group on another node, whose copy it
// fetches from that member. `mqd restore` makes a data dir whose node holds
// the metadata group and every data group, itself their one member; on it
// every topic's messages are there, a consumer group's acks hold (the
// acked messages are not delivered again, the others are), a dead letter
// is kept, and a key answers duplicate at its original position. Nodes
// that join then get the groups' replicas back by a rebalance. Before this
// change the backup answered 409 backup_data_groups.
func TestBackupDataGroups(t *testing.T) {
	t.Parallel()
	// With auth on: the backup node fetches the copy it does not hold with
	// its own credentials (--node-token), not the caller's.
	fx := tc.AuthTokens(t, map[string][]string{
		"node": {"cluster"},
		"ops":  {"monitor", "admin:*", "consume:*", "publish:*", "cluster"},
	})
	c := tc.StartAuth(t, 3, fx, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	topics := []string{"bk-a", "bk-b", "bk-c"}
	for i, tp := range topics {
		// Kept an hour: with the default retention the 4 messages bk-a's
		// only group acks would be trimmed about a second later, before
		// or after the copy, and the check below reads every message.
		tc.MustTopic(t, nodes[i], tp, map[string]any{"partitions": 2, "retention_ms": 3600000})
	}
	systest.WaitSpread(t, nodes[0], topics)
	// The first single-replica topic goes to n1's group of one: the backup
	// is taken through n3, which holds no replica of it.
	const solo = "bk-solo"
	tc.MustTopic(t, nodes[1], solo, map[string]any{"replicas": 1})
	ctx := tc.CtxFor(t, 120*time.Second)
	via := nodes[2]
	_, _, reps, err := systest.TopicPlacement(ctx, via, solo)
	if err != nil || len(reps) != 1 || reps[0] == via.ID() {
		t.Fatalf("topic %s: replicas %v %v, want one node other than %s", solo, reps, err, via)
	}
	all := append(slices.Clone(topics), solo)
	orig := map[string]tc.PublishResult{} // key → where it was stored
	for _, tp := range all {
		for i := range 10 {
			k := fmt.Sprintf("%s-k%d", tp, i)
			orig[k] = tc.MustPublish(t, nodes[i%3], tp, "v-"+k, map[string]string{"Idempotency-Key": k})
		}
	}
	// bk-a's group "workers" acks 4 messages; bk-b's "billing" dead-letters one.
	msgs, _, err := nodes[0].Fetch(ctx, "bk-a", "workers", tc.FetchRequest{Max: 4, LeaseMs: 60000})
	if err != nil || len(msgs) != 4 {
		t.Fatalf("fetch bk-a/workers: %d messages, %v; want 4", len(msgs), err)
	}
	acked := map[string]bool{}
	for _, m := range msgs {
		acked[m.IdempotencyKey] = true
	}
	if err := tc.AckAll(ctx, nodes[0], "bk-a", "workers", msgs); err != nil {
		t.Fatal(err)
	}
	m, _ := systest.RtFetchOne(t, nodes[1], "bk-b", "billing", 10*time.Second, 60000)
	systest.RtNack(t, nodes[1], "bk-b", "billing", []string{m.Receipt}, map[string]any{"reason": "poison", "retryable": false})
	systest.RtWaitDLQ(t, nodes[1], "bk-b", "billing", 1, 10*time.Second)

	// The backup node's own replicas have applied all of it (a follower's
	// copy holds what it applied): its stale reads show it.
	waitReplicasApplied(ctx, t, via, all)

	r, err := via.Do(ctx, http.MethodGet, "/v1/cluster/backup", nil, nil)
	if err != nil || r.Expect(http.StatusOK) != nil {
		t.Fatalf("backup through %s: %v %v", via, err, r.Expect(http.StatusOK))
	}
	if ct, n := r.Header.Get("Content-Type"), r.Header.Get("Mq-Backup-Groups"); ct != "application/x-tar" || n != "5" {
		t.Fatalf("backup: Content-Type %q, Mq-Backup-Groups %q; want an archive of 5 groups", ct, n)
	}
	manifest := archiveManifest(t, r.Body)
	if !strings.Contains(manifest, `"from": "`+reps[0]+`"`) {
		t.Errorf("manifest %s: want the single-replica group copied from %s", manifest, reps[0])
	}
	file := filepath.Join(t.TempDir(), "backup.tar")
	if err := os.WriteFile(file, r.Body, 0o600); err != nil {
		t.Fatal(err)
	}
	c.KillAll()

	// An archive that is not an mqd backup: refused, nothing left behind.
	bogus := filepath.Join(t.TempDir(), "bogus.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "notes.txt", Mode: 0o600, Size: 2})
	_, _ = tw.Write([]byte("hi"))
	_ = tw.Close()
	if err := os.WriteFile(bogus, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyDir := filepath.Join(t.TempDir(), "empty")
	if out, err := systest.RunMqd(t, "restore", "--data-dir", emptyDir, bogus); err == nil || !strings.Contains(out, "not an mqd backup") {
		t.Errorf("restore of a tar that is no backup: %v, %q; want a failure naming it", err, out)
	}
	if ents, _ := os.ReadDir(emptyDir); len(ents) != 0 {
		t.Errorf("a failed restore left %d files in the data dir", len(ents))
	}

	rc := tc.Start(t, 1, tc.WithFlags("--data-groups"), tc.WithNodeArgs(func(n *tc.Node) []string {
		if n.ID() != "n1" { // nodes added later join with empty dirs
			return nil
		}
		out, err := systest.RunMqd(t, "restore", "--data-dir", n.DataDir(), "--id", n.ID(), "--raft-addr", n.RaftAddr(), file)
		if err != nil || strings.Count(out, "restored data group") != 4 {
			t.Fatalf("mqd restore: %v\n%s", err, out)
		}
		t.Logf("mqd restore:\n%s", out)
		return nil
	}))
	n := rc.Node(0)
	rctx := tc.CtxFor(t, 90*time.Second)
	groups, err := systest.ClusterGroups(rctx, n)
	if err != nil || len(groups) != 4 {
		t.Fatalf("restored node's groups %v %v, want 4", groups, err)
	}
	for id, ms := range groups {
		if !slices.Equal(ms, []string{n.ID()}) {
			t.Errorf("restored group %s has members %v, want [%s]", id, ms, n.ID())
		}
	}
	// Every topic's every message, through a new group.
	checkRestoredKeys(rctx, t, n, all)
	// The group's progress: the 6 it had not acked, none of the 4 it had.
	got, err := tc.Drain(rctx, n, "bk-a", "workers", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 {
		t.Errorf("bk-a/workers on the restored node: %d messages, want the 6 not acked", len(got))
	}
	for _, m := range got {
		if acked[m.IdempotencyKey] {
			t.Errorf("%s was acked before the backup and is delivered again", m.IdempotencyKey)
		}
	}
	if dl := systest.RtWaitDLQ(t, n, "bk-b", "billing", 1, 10*time.Second); dl[0].RejectReason != "poison" {
		t.Errorf("restored dead letter %+v, want the reason poison", dl[0])
	}
	for _, k := range []string{"bk-c-k3", solo + "-k7"} {
		tp := strings.TrimSuffix(k, k[strings.LastIndex(k, "-"):])
		dup := tc.MustPublish(t, n, tp, "again", map[string]string{"Idempotency-Key": k})
		if !dup.Duplicate || dup.Partition != orig[k].Partition || dup.Offset != orig[k].Offset {
			t.Errorf("re-publish of %s on the restored node: %+v; want duplicate at %d/%d", k, dup, orig[k].Partition, orig[k].Offset)
		}
	}
	// New writes go on in the restored groups.
	if pr := tc.MustPublish(t, n, solo, "after", map[string]string{"Idempotency-Key": "fresh"}); pr.Duplicate {
		t.Errorf("a new key on the restored node answered duplicate: %+v", pr)
	}

	growRestored(rctx, t, rc, topics)
}

// waitReplicasApplied waits until via's replicas of topics show, read
// stale, the 10 messages of each and what TestBackupDataGroups did to
// bk-a's and bk-b's groups.
func waitReplicasApplied(ctx context.Context, t *testing.T, via *tc.Node, topics []string) {
	t.Helper()
	for _, tp := range topics {
		for {
			var st tc.TopicStats
			r, err := via.Do(ctx, http.MethodGet, "/v1/topics/"+tp+"?stale=ok", nil, nil)
			if err == nil {
				err = r.JSON(&st)
			}
			done := err == nil && st.NextOffsets() == 10
			switch tp {
			case "bk-a":
				done = done && st.Groups["workers"].Acked == 4
			case "bk-b":
				done = done && st.Groups["billing"].DLQ == 1
			}
			if done {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s's replica of %s: %+v %v", via, tp, st, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// checkRestoredKeys checks that n delivers every one of the 10 keys
// <topic>-k<i> of each of topics to a new consumer group.
func checkRestoredKeys(ctx context.Context, t *testing.T, n *tc.Node, topics []string) {
	t.Helper()
	for _, tp := range topics {
		got, err := tc.Drain(ctx, n, tp, "check", time.Second)
		if err != nil {
			t.Fatalf("drain %s on the restored node: %v", tp, err)
		}
		var keys []string
		for _, m := range got {
			keys = append(keys, m.IdempotencyKey)
		}
		slices.Sort(keys)
		var want []string
		for i := range 10 {
			want = append(want, fmt.Sprintf("%s-k%d", tp, i))
		}
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Errorf("restored %s holds %v, want %v", tp, keys, want)
		}
	}
}

// growRestored joins two nodes to the restored cluster rc and checks that
// a rebalance grows each restored group back to the members it had
// (three; one for the single-replica group), and that the new replicas
// hold topics, all of three replicas.
func growRestored(ctx context.Context, t *testing.T, rc *tc.Cluster, topics []string) {
	t.Helper()
	n := rc.Node(0)
	n2, n3 := rc.AddNode("n2"), rc.AddNode("n3")
	if _, err := rc.WaitReady(ctx); err != nil {
		t.Fatalf("nodes joining the restored cluster: %v", err)
	}
	r, err := n.Do(ctx, http.MethodPost, "/v1/cluster/rebalance", nil, nil)
	if err == nil {
		err = r.Expect(http.StatusOK)
	}
	if err != nil {
		t.Fatalf("rebalance: %v", err)
	}
	t.Logf("rebalance of the restored cluster: %s", r.Body)
	for id, want := range map[string]int{"g1": 3, "g2": 3, "g3": 3, "g4": 1} {
		ms, err := systest.ClusterGroups(ctx, n)
		if err != nil || len(ms[id]) != want {
			t.Fatalf("after the rebalance group %s has members %v (%v), want %d", id, ms[id], err, want)
		}
	}
	for _, tp := range topics {
		for {
			_, _, reps, err := systest.TopicPlacement(ctx, n, tp)
			var st tc.TopicStats
			r, serr := n3.Do(ctx, http.MethodGet, "/v1/topics/"+tp+"?stale=ok", nil, nil)
			if serr == nil {
				serr = r.JSON(&st)
			}
			if err == nil && len(reps) == 3 && serr == nil && st.NextOffsets() == 10 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("topic %s: replicas %v (%v); %s's replica %+v (%v); want 3 replicas, 10 messages", tp, reps, err, n3, st, serr)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if _, err := systest.PublishRetry(ctx, []*tc.Node{n2}, "bk-a", "after-growth"); err != nil {
		t.Fatalf("publish after the growth: %v", err)
	}
}

// archiveManifest checks that body is a tar archive starting with
// manifest.json followed by default.db and g1..g4, and answers the
// manifest.
func archiveManifest(t *testing.T, body []byte) string {
	t.Helper()
	return archiveManifestOf(t, body, []string{"default.db", "g1.db", "g2.db", "g3.db", "g4.db"})
}

// archiveManifestOf checks that body is a tar archive of manifest.json
// and the files named, and answers the manifest.
func archiveManifestOf(t *testing.T, body []byte, files []string) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(body))
	h, err := tr.Next()
	if err != nil || h.Name != "manifest.json" {
		t.Fatalf("backup archive: first entry %v %v, want manifest.json", h, err)
	}
	var b bytes.Buffer
	if _, err := b.ReadFrom(tr); err != nil {
		t.Fatal(err)
	}
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if !slices.Equal(names, files) {
		t.Errorf("archive files %v, want %v", names, files)
	}
	return b.String()
}

// TestBackupDataGroupsTLS: with TLS and no node token, the node taking a
// backup fetches the copy of a group it holds no replica of with its
// certificate (a node-to-node route).
func TestBackupDataGroupsTLS(t *testing.T) {
	t.Parallel()
	ca := tc.NewCA(t, "cluster-ca")
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*", "publish:*", "consume:*", "cluster"}})
	cl := tc.NewTLSClient(15*time.Second, 16, ca.Pool(), nil).WithToken(fx.Secrets["ops"])
	c := tc.Start(t, 3, tc.WithTLS(ca), tc.WithClient(cl), tc.WithFlags("--auth-file", fx.Path, "--data-groups"))
	nodes := c.Nodes()
	tc.MustTopic(t, nodes[0], "tls-solo", map[string]any{"replicas": 1})
	ctx := tc.CtxFor(t, 60*time.Second)
	_, _, reps, err := systest.TopicPlacement(ctx, nodes[0], "tls-solo")
	if err != nil || len(reps) != 1 {
		t.Fatalf("placement: %v %v", reps, err)
	}
	tc.MustPublish(t, nodes[0], "tls-solo", "m", nil)
	var via *tc.Node
	for _, n := range nodes {
		if n.ID() != reps[0] {
			via = n
		}
	}
	r, err := via.Do(ctx, http.MethodGet, "/v1/cluster/backup", nil, nil)
	if err != nil || r.Expect(http.StatusOK) != nil {
		t.Fatalf("backup through %s over TLS: %v %v", via, err, r.Expect(http.StatusOK))
	}
	if m := archiveManifestOf(t, r.Body, []string{"default.db", "g1.db"}); !strings.Contains(m, `"from": "`+reps[0]+`"`) {
		t.Errorf("manifest %s: want g1 copied from %s", m, reps[0])
	}
}
