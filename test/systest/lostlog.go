package systest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	bolt "go.etcd.io/bbolt"
)

func MustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WaitSameApplied waits until every node has applied, in raft group g,
// what the first one has.
func WaitSameApplied(t *testing.T, g string, nodes ...*tc.Node) {
	t.Helper()
	ctx := tc.CtxFor(t, 30*time.Second)
	want := GroupApplied(t, nodes[0], g)
	for _, n := range nodes[1:] {
		for {
			if v, ok := GroupFigure(ctx, t, n, "mqd_raft_applied_index", g); ok && uint64(v) >= want {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s did not apply index %d", n, want)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// CompareStates compares the nodes' fsm.db files key by key, as the chaos
// harness does (test/chaos/replicas.go): it freezes every node (SIGSTOP),
// copies each file, resumes them, and compares the copies once they were
// taken at one applied index (the leader may still commit, e.g. a trim).
func CompareStates(t *testing.T, c *tc.Cluster) {
	t.Helper()
	nodes := c.Nodes()
	WaitSameApplied(t, "default", nodes...)
	CompareStateFiles(t, nodes, "fsm.db")
}

// CompareStateFiles compares the state file at rel (under each node's
// data dir; "groups/<id>/fsm.db" for a data group) on nodes, copied while
// they are frozen, until the copies were taken at one applied index.
func CompareStateFiles(t *testing.T, nodes []*tc.Node, rel string) {
	t.Helper()
	dir := t.TempDir()
	var applied []uint64
	for attempt := range 20 {
		if attempt > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		paths := make([]string, len(nodes))
		for _, n := range nodes {
			n.Pause()
		}
		for i, n := range nodes {
			paths[i] = filepath.Join(dir, fmt.Sprintf("%s-%d.db", n.ID(), attempt))
			err := os.WriteFile(paths[i], MustRead(t, filepath.Join(n.DataDir(), rel)), 0o600)
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range nodes {
			n.Resume()
		}
		states := make([]map[string][]byte, len(nodes))
		applied = applied[:0]
		for i := range nodes {
			states[i] = readFSM(t, paths[i])
			var idx uint64
			if v := states[i][`"meta"/"applied_index"`]; len(v) == 8 {
				idx = binary.BigEndian.Uint64(v)
			}
			applied = append(applied, idx)
		}
		if slices.Min(applied) != slices.Max(applied) {
			continue
		}
		if diff := diffStates(states); len(diff) > 0 {
			t.Errorf("replicas of %s at applied index %d differ in %d keys, e.g. %v", rel, applied[0], len(diff), diff[:min(5, len(diff))])
		}
		return
	}
	t.Fatalf("the nodes' %s were never copied at one applied index (last %v)", rel, applied)
}

// diffStates lists the keys whose values are not the same in every state.
func diffStates(states []map[string][]byte) []string {
	keys := map[string]bool{}
	for _, s := range states {
		for k := range s {
			keys[k] = true
		}
	}
	var diff []string
	for k := range keys {
		for i := 1; i < len(states); i++ {
			v0, ok0 := states[0][k]
			if v, ok := states[i][k]; ok != ok0 || !bytes.Equal(v0, v) {
				diff = append(diff, k)
				break
			}
		}
	}
	sort.Strings(diff)
	return diff
}

// readFSM flattens a state file: bucket path/key → value.
func readFSM(t *testing.T, path string) map[string][]byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer db.Close()
	out := map[string][]byte{}
	var walk func(b *bolt.Bucket, prefix string)
	walk = func(b *bolt.Bucket, prefix string) {
		_ = b.ForEach(func(k, v []byte) error {
			p := prefix + "/" + strconv.Quote(string(k))
			if v == nil && b.Bucket(k) != nil {
				walk(b.Bucket(k), p)
				return nil
			}
			out[p] = append([]byte(nil), v...)
			return nil
		})
	}
	_ = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			walk(b, strconv.Quote(string(name)))
			return nil
		})
	})
	return out
}
