package chaos

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	bolt "go.etcd.io/bbolt"
)

// Replica divergence. Raft only promises that every node applies the same
// commands in the same order; the broker must make applying them
// deterministic. This check looks at the result: it freezes every node
// (SIGSTOP), copies each node's state file (fsm.db), resumes them, and when
// the copies were taken at the same applied index compares them key by key.
//
// It is the one white-box check of the harness: it knows that the state is a
// bbolt file named fsm.db in the data directory, with the applied index under
// meta/applied_index, and nothing else about its layout.

const (
	fsmFile = "fsm.db"
)

var (
	metaBucket = []byte("meta")
	appliedKey = []byte("applied_index")
)

// replicaState is one node's state file flattened: path of every key → value.
type replicaState struct {
	node    string
	applied uint64
	keys    map[string][]byte
}

// compareReplicas returns the differences between the nodes' states, or an
// error if it could not catch them at one applied index.
func compareReplicas(c *tc.Cluster, tmp string) ([]string, error) {
	diffs, _, err := compareGroup(c.Nodes(), fsmFile, tmp)
	return diffs, err
}

// compareGroup compares the state file at rel (relative to each node's
// data directory) of the given nodes, the replicas of one group: it
// answers the differences and the applied index they were compared at, or
// an error if it could not catch them at one applied index.
func compareGroup(nodes []*tc.Node, rel, tmp string) ([]string, uint64, error) {
	var last []uint64
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		states, err := snapshotReplicas(nodes, rel, tmp)
		if err != nil {
			return nil, 0, err
		}
		last = last[:0]
		same := true
		for _, s := range states {
			last = append(last, s.applied)
			if s.applied != states[0].applied {
				same = false
			}
		}
		if !same {
			continue
		}
		if states[0].applied == 0 {
			return nil, 0, fmt.Errorf("%s: no applied index", rel)
		}
		return diffReplicas(states), states[0].applied, nil
	}
	return nil, 0, fmt.Errorf("%s: applied indexes never equal while frozen (last %v)", rel, last)
}

// snapshotReplicas freezes the nodes, copies the state file at rel of
// each, and resumes them.
func snapshotReplicas(nodes []*tc.Node, rel, tmp string) ([]replicaState, error) {
	if len(nodes) < 2 {
		return nil, fmt.Errorf("%s: %d replicas, nothing to compare", rel, len(nodes))
	}
	for _, n := range nodes {
		if !n.Live() {
			return nil, fmt.Errorf("node %s is not running", n.ID())
		}
	}
	for _, n := range nodes {
		n.Pause()
	}
	var copyErr error
	paths := make([]string, len(nodes))
	for i, n := range nodes {
		paths[i] = filepath.Join(tmp, n.ID()+"-"+strings.ReplaceAll(rel, string(filepath.Separator), "-"))
		b, err := os.ReadFile(filepath.Join(n.DataDir(), rel))
		if err == nil {
			err = os.WriteFile(paths[i], b, 0o600)
		}
		if err != nil && copyErr == nil {
			copyErr = err
		}
	}
	for _, n := range nodes {
		n.Resume()
	}
	if copyErr != nil {
		return nil, copyErr
	}
	out := make([]replicaState, len(nodes))
	for i, n := range nodes {
		s, err := readState(paths[i])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.ID(), err)
		}
		s.node = n.ID()
		out[i] = s
	}
	return out, nil
}

func readState(path string) (replicaState, error) {
	s := replicaState{keys: map[string][]byte{}}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return s, err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(metaBucket); m != nil {
			if v := m.Get(appliedKey); len(v) == 8 {
				s.applied = binary.BigEndian.Uint64(v)
			}
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			flatten(b, strconv.Quote(string(name)), s.keys)
			return nil
		})
	})
	delete(s.keys, strconv.Quote(string(metaBucket))+"/"+strconv.Quote(string(appliedKey)))
	return s, err
}

func flatten(b *bolt.Bucket, prefix string, out map[string][]byte) {
	_ = b.ForEach(func(k, v []byte) error {
		p := prefix + "/" + strconv.Quote(string(k))
		if v == nil {
			if sb := b.Bucket(k); sb != nil {
				flatten(sb, p, out)
				return nil
			}
		}
		out[p] = append([]byte(nil), v...)
		return nil
	})
}

// diffReplicas lists every key whose value is not the same on every node.
func diffReplicas(states []replicaState) []string {
	all := map[string]bool{}
	for _, s := range states {
		for k := range s.keys {
			all[k] = true
		}
	}
	var keys []string
	for k := range all {
		v0, ok0 := states[0].keys[k]
		for _, s := range states[1:] {
			if v, ok := s.keys[k]; ok != ok0 || !bytes.Equal(v, v0) {
				keys = append(keys, k)
				break
			}
		}
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		line := "key " + k + ":"
		for _, s := range states {
			if v, ok := s.keys[k]; ok {
				line += fmt.Sprintf(" %s=%s", s.node, shortHex(v))
			} else {
				line += fmt.Sprintf(" %s=absent", s.node)
			}
		}
		out = append(out, fmt.Sprintf("applied index %d: %s", states[0].applied, line))
	}
	return out
}

func shortHex(v []byte) string {
	if len(v) > 24 {
		return fmt.Sprintf("%x...(%d bytes)", v[:24], len(v))
	}
	return fmt.Sprintf("%x", v)
}
