package fsm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/mqd/mqd/command"
)

// dumpTx flattens every key of tx (nested buckets by path) into a map.
func dumpTx(tx *bolt.Tx) map[string]string {
	out := map[string]string{}
	var walk func(prefix string, b *bolt.Bucket)
	walk = func(prefix string, b *bolt.Bucket) {
		_ = b.ForEach(func(k, v []byte) error {
			if v == nil {
				walk(prefix+string(k)+"/", b.Bucket(k))
				return nil
			}
			out[prefix+string(k)] = string(v)
			return nil
		})
	}
	_ = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		walk(string(name)+"/", b)
		return nil
	})
	return out
}

// dumpFile opens a copy of a bbolt file read-only and dumps it; a panic
// or an error of bbolt's check is returned as an error.
func dumpFile(t *testing.T, path string) (m map[string]string, err error) {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "copy.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// As OpenFSM does: faults are panics here, and the tree is walked on
	// this goroutine before tx.Check walks it on its own.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, InitialMmapSize: fsmMmapSize})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := checkTree(db, walkTree); err != nil {
		return nil, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		m = dumpTx(tx)
		return nil
	})
	return m, err
}

func sameDump(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// powerLoss rewrites the file at path the way a power cut may leave it: of
// every page written since the last fsync (synced is the file's content
// then), some reached the disk and some did not; the newer meta pages did.
func powerLoss(t *testing.T, path string, synced []byte, seed uint64, keep float64) {
	t.Helper()
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, seed))
	out := append([]byte(nil), cur...)
	reverted := 0
	for off := 2 * fsmPageSize; off < len(out); off += fsmPageSize {
		end := min(off+fsmPageSize, len(out))
		if off >= len(synced) {
			if r.Float64() >= keep {
				clear(out[off:end]) // never reached the disk: a hole
			}
			continue
		}
		if !bytes.Equal(out[off:end], synced[off:min(end, len(synced))]) && r.Float64() >= keep {
			copy(out[off:end], synced[off:])
			reverted++
		}
	}
	if reverted == 0 {
		t.Fatalf("seed %d: no page reverted: the test would show nothing", seed)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A power cut that keeps the boot id (a VM restored, storage that lost its
// write cache) leaves fsm.db torn: newer meta pages over data pages of
// which only some reached the disk. The old rule — trust fsm.db when the
// state file says "open" with this boot's id — opened such a file as it
// was; this shows what that gives (bbolt's check fails, it panics, or it
// holds neither the synced state nor the newest), and that the checkpoint
// rule opens it at the checkpoint with exactly the state it had there.
func TestCheckpointSurvivesPowerLoss(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		keep := []float64{0, 0.3, 0.5, 0.8}[seed-1]
		t.Run(fmt.Sprintf("seed%d-keep%.1f", seed, keep), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fsm.db")
			h := openAt(t, path)
			h.f.stopCheckpoints() // the test decides when they are taken
			h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
			val := strings.Repeat("a", 900)
			for i := 0; i < 40; i++ {
				h.batch(publish(int64(i+2), "t", msg(val)), setNode(fmt.Sprint("n", i%5)))
			}
			h.checkpoint()
			ckIndex := h.f.AppliedIndex()
			synced, err := os.ReadFile(path) // exactly what the fsync made durable
			if err != nil {
				t.Fatal(err)
			}
			want, err := dumpFile(t, path)
			if err != nil {
				t.Fatal(err)
			}
			// More batches, never fsynced: trims free pages, which bbolt
			// reuses; the meta pages are rewritten many times over.
			for i := 0; i < 200; i++ {
				tp := fmt.Sprint("u", i/20)
				if i%20 == 0 {
					h.must(&command.Command{Op: command.OpPutTopic, Now: int64(i + 100), Topic: tp})
				}
				h.batch(publish(int64(i+100), tp, msg(strings.Repeat("b", 700+i))), publish(int64(i+100), "t", msg(val)))
				if i%20 == 19 {
					h.must(&command.Command{Op: command.OpDeleteTopic, Now: int64(i + 100), Topic: tp})
				}
			}
			newest, err := dumpFile(t, path)
			if err != nil {
				t.Fatal(err)
			}
			h.crash()
			powerLoss(t, path, synced, seed, keep)

			asIs, err := dumpFile(t, path) // what the boot-id rule opened
			if err == nil && (sameDump(asIs, want) || sameDump(asIs, newest)) {
				t.Fatalf("the torn file opened as it is gives a consistent state: the test shows nothing")
			}
			t.Logf("opened as it is (the boot-id rule): %d keys, err %v", len(asIs), err)

			h = openAt(t, path)
			defer h.f.Close()
			if got := h.f.AppliedIndex(); got != ckIndex {
				t.Fatalf("opened at applied index %d, want the checkpoint's %d", got, ckIndex)
			}
			var got map[string]string
			_ = h.f.View(func(tx *bolt.Tx) error { got = dumpTx(tx); return nil })
			if !sameDump(got, want) {
				t.Fatalf("opened at the checkpoint with %d keys, not the %d it held there", len(got), len(want))
			}
			if err := h.f.View(func(tx *bolt.Tx) error {
				for e := range tx.Check() {
					return e
				}
				return nil
			}); err != nil {
				t.Fatalf("check after open: %v", err)
			}
		})
	}
}

// Without the checkpoint's read transaction, syncing at index K and
// replaying from K (the first idea) is not enough: bbolt reuses
// K's freed pages, so after the same power cut the tree at K is torn too.
func TestCheckpointNeedsItsPin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fsm.db")
	h := openAt(t, path)
	h.f.stopCheckpoints()
	h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
	for i := 0; i < 40; i++ {
		h.batch(publish(int64(i+2), "t", msg(strings.Repeat("a", 900))), setNode(fmt.Sprint("n", i%5)))
	}
	h.checkpoint()
	want, err := dumpFile(t, path)
	if err != nil {
		t.Fatal(err)
	}
	h.f.ckMu.Lock()
	h.f.releasePin() // synced and recorded, but no longer pinned
	h.f.ckMu.Unlock()
	for i := 0; i < 200; i++ {
		tp := fmt.Sprint("u", i/20)
		if i%20 == 0 {
			h.must(&command.Command{Op: command.OpPutTopic, Now: int64(i + 100), Topic: tp})
		}
		h.batch(publish(int64(i+100), tp, msg(strings.Repeat("b", 700+i))), setNode(fmt.Sprint("n", i%5)))
		if i%20 == 19 {
			h.must(&command.Command{Op: command.OpDeleteTopic, Now: int64(i + 100), Topic: tp})
		}
	}
	h.crash()
	// Even with every later write on disk (no cut at all), K's tree is no
	// longer there: put the recorded meta back by hand, as the rule would.
	st, err := readFSMState(path)
	if err != nil || st.ckpt == nil {
		t.Fatalf("state %+v %v", st, err)
	}
	if err := putCheckpointMeta(path, st.ckpt); err != nil {
		t.Fatal(err)
	}
	got, err := dumpFile(t, path)
	if err == nil && sameDump(got, want) {
		t.Fatal("the unpinned tree survived: the test shows nothing (bbolt reused none of its pages)")
	}
	t.Logf("the synced but unpinned tree after later commits: %d keys of %d, err %v", len(got), len(want), err)
}

// A file that fails its checks at open is set aside, never deleted, and
// the state starts empty; each case is one recovery with its reason.
func TestDamagedFSMSetAside(t *testing.T) {
	cases := []struct {
		name, reason string
		damage       func(t *testing.T, path string)
	}{
		{"truncated", "truncated", func(t *testing.T, path string) {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"meta-garbage", "meta_invalid", func(t *testing.T, path string) {
			w, _ := os.OpenFile(path, os.O_RDWR, 0)
			defer w.Close()
			junk := bytes.Repeat([]byte{0x5a}, 64)
			w.WriteAt(junk, 16)
			w.WriteAt(junk, fsmPageSize+16)
		}},
		{"replaced", "changed_after_close", func(t *testing.T, path string) {
			other := filepath.Join(t.TempDir(), "other.db")
			h := openAt(t, other)
			h.must(setNode("x"))
			if err := h.f.Close(); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(other)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"leaf-garbage", "check_failed", func(t *testing.T, path string) {
			// The root bucket's page overwritten with a free page's bytes.
			_, m, _, err := currentMeta(path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(path)
			clear(b[m.root*fsmPageSize : (m.root+1)*fsmPageSize])
			os.WriteFile(path, b, 0o600)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fsm.db")
			h := openAt(t, path)
			h.must(&command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
			for i := 0; i < 60; i++ {
				h.batch(publish(int64(i+2), "t", msg(strings.Repeat("a", 900))), setNode(fmt.Sprint("n", i)))
			}
			if err := h.f.Close(); err != nil {
				t.Fatal(err)
			}
			c.damage(t, path)
			var reasons []string
			h = openAt(t, path)
			defer h.f.Close()
			h.f.OnRecovery(func(r string) { reasons = append(reasons, r) })
			if got := h.f.AppliedIndex(); got != 0 {
				t.Fatalf("applied index %d after the damage, want 0 (empty)", got)
			}
			if len(reasons) != 1 || reasons[0] != c.reason {
				t.Fatalf("recoveries %v, want [%s]", reasons, c.reason)
			}
			if m, _ := filepath.Glob(path + ".damaged-*"); len(m) != 1 {
				t.Fatalf("set aside: %v, want one fsm.db.damaged-*", m)
			}
		})
	}
}
