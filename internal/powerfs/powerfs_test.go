package powerfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// mountT mounts a powerfs for t, or skips (fails when CI is set) when this
// machine cannot.
func mountT(t *testing.T) (*FS, string) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %v", err)
		}
		t.Skip(err)
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	p, err := Mount(filepath.Join(root, "backing"), mnt, Options{Seed: 7})
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and the mount failed: %v", err)
		}
		t.Skipf("cannot mount a FUSE filesystem here: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return p, mnt
}

func cut(t *testing.T, p *FS, torn bool) Report {
	t.Helper()
	r, err := p.Cut(torn)
	if err != nil {
		t.Fatalf("cut: %v", err)
	}
	t.Logf("cut: %v", r)
	return r
}

func syncDir(t *testing.T, d string) {
	t.Helper()
	f, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync %s: %v", d, err)
	}
}

// writeFile writes data to name, fsyncs it if sync, and closes it.
func writeFile(t *testing.T, name string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func expectContent(t *testing.T, name, want string) {
	t.Helper()
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	if string(got) != want {
		t.Fatalf("%s holds %q, want %q", filepath.Base(name), got, want)
	}
}

func TestSyncedWriteSurvivesCut(t *testing.T) {
	p, mnt := mountT(t)
	name := filepath.Join(mnt, "f")
	writeFile(t, name, []byte("durable"), true)
	syncDir(t, mnt)
	cut(t, p, true)
	expectContent(t, name, "durable")
}

func TestUnsyncedWriteDropped(t *testing.T) {
	p, mnt := mountT(t)
	name := filepath.Join(mnt, "f")
	writeFile(t, name, bytes.Repeat([]byte("a"), 5000), true)
	syncDir(t, mnt)
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("bbbb"), 4094); err != nil { // across a block boundary
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("cccc"), 5000); err != nil { // past the synced size
		t.Fatal(err)
	}
	f.Close()
	// The running processes see their writes.
	want := string(bytes.Repeat([]byte("a"), 4094)) + "bbbb" + string(bytes.Repeat([]byte("a"), 902)) + "cccc"
	expectContent(t, name, want)
	r := cut(t, p, false)
	if r.Files != 1 {
		t.Errorf("cut rolled back %d files, want 1", r.Files)
	}
	expectContent(t, name, string(bytes.Repeat([]byte("a"), 5000)))
}

func TestTruncateWithoutSyncUndone(t *testing.T) {
	p, mnt := mountT(t)
	name := filepath.Join(mnt, "f")
	writeFile(t, name, []byte("0123456789"), true)
	syncDir(t, mnt)
	if err := os.Truncate(name, 3); err != nil {
		t.Fatal(err)
	}
	writeFile(t, name, []byte("xy"), false) // O_TRUNC and a write
	cut(t, p, false)
	expectContent(t, name, "0123456789")
}

func TestCreateWithoutDirSyncDisappears(t *testing.T) {
	p, mnt := mountT(t)
	kept, lost := filepath.Join(mnt, "kept"), filepath.Join(mnt, "sub", "lost")
	writeFile(t, kept, []byte("k"), true)
	syncDir(t, mnt)
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, lost, []byte("l"), true) // data synced, entry not
	if err := os.Remove(kept); err != nil {
		t.Fatal(err)
	}
	cut(t, p, false)
	expectContent(t, kept, "k") // the unlink was not durable
	if _, err := os.Stat(filepath.Join(mnt, "sub")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory created without a directory fsync survived the cut: %v", err)
	}
}

func TestRenameWithoutDirSyncUndone(t *testing.T) {
	p, mnt := mountT(t)
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	writeFile(t, a, []byte("A"), true)
	writeFile(t, b, []byte("B"), true)
	syncDir(t, mnt)
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	expectContent(t, b, "A")
	cut(t, p, false)
	expectContent(t, a, "A")
	expectContent(t, b, "B")
}

// TestRenamePattern: write a temporary file, fsync it, rename it over the
// old one, fsync the directory: the new content survives; without the
// directory fsync the old one does; without the file fsync the new name
// holds an empty file.
func TestRenamePattern(t *testing.T) {
	p, mnt := mountT(t)
	name, tmp := filepath.Join(mnt, "state"), filepath.Join(mnt, "state.tmp")
	writeFile(t, name, []byte("v1"), true)
	syncDir(t, mnt)

	writeFile(t, tmp, []byte("v2"), true)
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	cut(t, p, false)
	expectContent(t, name, "v2")

	writeFile(t, tmp, []byte("v3"), true)
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	cut(t, p, false)
	expectContent(t, name, "v2")
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists after the cut: %v", tmp, err)
	}

	writeFile(t, tmp, []byte("v4"), false)
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	cut(t, p, false)
	expectContent(t, name, "")
}

func TestTornWriteKeepsPrefix(t *testing.T) {
	p, mnt := mountT(t)
	name := filepath.Join(mnt, "f")
	writeFile(t, name, []byte("head:"), true)
	syncDir(t, mnt)
	tail := bytes.Repeat([]byte("0123456789"), 1000)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(tail); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if r := cut(t, p, true); r.Torn != 1 {
		t.Fatalf("torn files %d, want 1", r.Torn)
	}
	got, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("head:"), tail...)
	if len(got) <= 5 || len(got) >= len(want) || !bytes.Equal(got, want[:len(got)]) {
		t.Fatalf("after a torn cut the file holds %d bytes (want a strict prefix of the write, 6..%d bytes, on the synced head)", len(got), len(want)-1)
	}
}

// TestBoltAcrossCut: a bbolt database (mmap reads, pwrite and fdatasync
// writes) keeps its synced transactions across a cut, loses the unsynced
// one (NoSync), and opens consistent. (A torn cut of a NoSync transaction
// may keep its meta page without its data pages, so it is not tried: bbolt
// without fsync is not safe against power loss.) The database is used by a
// child process: a Go process must not fault pages of its own FUSE mount in
// (a stop-the-world would wait for the faulting thread, which waits for the
// server's goroutines).
func TestBoltAcrossCut(t *testing.T) {
	for _, noSync := range []bool{false, true} {
		t.Run(map[bool]string{false: "synced", true: "nosync"}[noSync], func(t *testing.T) {
			p, mnt := mountT(t)
			path := filepath.Join(mnt, "x.db")
			boltChild(t, "write", path, noSync)
			cut(t, p, !noSync)
			boltChild(t, "check", path, noSync)
		})
	}
}

// boltChild runs TestBoltChild in a child process of this test binary.
func boltChild(t *testing.T, step, path string, noSync bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBoltChild$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("POWERFS_BOLT_CHILD=%s,%v,%s", step, noSync, path))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bolt %s: %v\n%s", step, err, out)
	}
}

// TestBoltChild is TestBoltAcrossCut's child process.
func TestBoltChild(t *testing.T) {
	arg, ok := os.LookupEnv("POWERFS_BOLT_CHILD")
	if !ok {
		t.Skip("the child process of TestBoltAcrossCut")
	}
	step, rest, _ := strings.Cut(arg, ",")
	ns, path, _ := strings.Cut(rest, ",")
	noSync := ns == "true"
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer db.Close()
	val := func(k string) []byte { return bytes.Repeat([]byte(k), 3000) }
	if step == "write" {
		syncDir(t, filepath.Dir(path))
		for _, k := range []string{"k1", "k2", "k3", "k4"} {
			db.NoSync = noSync && k == "k4"
			if err := db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucketIfNotExists([]byte("b"))
				if err != nil {
					return err
				}
				return b.Put([]byte(k), val(k))
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		b := tx.Bucket([]byte("b"))
		for _, k := range []string{"k1", "k2", "k3"} {
			if !bytes.Equal(b.Get([]byte(k)), val(k)) {
				return errors.New("synced key " + k + " lost")
			}
		}
		want := step == "write" || !noSync // read through the mmap before the cut
		if got := b.Get([]byte("k4")) != nil; got != want {
			return fmt.Errorf("%s: key k4 (synced: %v) is there: %v", step, !noSync, got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDirectoryRenamePattern is raft's snapshot store: a temporary
// directory filled with synced files, renamed to its final name, the
// parent fsynced; then an older snapshot directory removed. Without the
// last fsync the removal is undone.
func TestDirectoryRenamePattern(t *testing.T) {
	p, mnt := mountT(t)
	snaps := filepath.Join(mnt, "snapshots")
	if err := os.Mkdir(snaps, 0o755); err != nil {
		t.Fatal(err)
	}
	snapshot := func(name, data string) {
		t.Helper()
		tmp := filepath.Join(snaps, name+".tmp")
		if err := os.Mkdir(tmp, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(tmp, "state.bin"), []byte(data), true)
		writeFile(t, filepath.Join(tmp, "meta.json"), []byte("{}"), true)
		if err := os.Rename(tmp, filepath.Join(snaps, name)); err != nil {
			t.Fatal(err)
		}
		syncDir(t, snaps)
	}
	snapshot("1-10", "old")
	snapshot("1-20", "new")
	if err := os.RemoveAll(filepath.Join(snaps, "1-10")); err != nil {
		t.Fatal(err)
	}
	cut(t, p, true)
	expectContent(t, filepath.Join(snaps, "1-20", "state.bin"), "new")
	expectContent(t, filepath.Join(snaps, "1-10", "state.bin"), "old")
	if _, err := os.Stat(filepath.Join(snaps, "1-20.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the temporary directory is back: %v", err)
	}
}

// TestFileSyncCommitsEntries: with the option, a file's fsync makes its
// creation (and every earlier entry operation) durable.
func TestFileSyncCommitsEntries(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and %v", err)
		}
		t.Skip(err)
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	p, err := Mount(filepath.Join(root, "backing"), mnt, Options{FileSyncCommitsEntries: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unmount()
	writeFile(t, filepath.Join(mnt, "a"), []byte("A"), true)
	writeFile(t, filepath.Join(mnt, "b"), []byte("B"), false)
	cut(t, p, false)
	expectContent(t, filepath.Join(mnt, "a"), "A")
	if _, err := os.Stat(filepath.Join(mnt, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b, created after the last fsync, survived the cut: %v", err)
	}
}

// TestMmapSeesOwnWrites: a process that writes pages with pwrite and reads
// them back through a shared mmap (as bbolt does) always reads what it
// wrote, while it also opens the file again and again (as mqd's
// checkpoints do) and other threads fault pages in. Without keepCache the
// kernel dropped the file's pages at every open, also those of a write
// the server had not yet made, and a read-ahead cached the older bytes:
// about one write in 20,000 read back stale (5 in 10 s here), and bbolt,
// reading a stale branch page, freed pages twice.
func TestMmapSeesOwnWrites(t *testing.T) {
	_, mnt := mountT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMmapChild$", "-test.v")
	cmd.Env = append(os.Environ(), "POWERFS_MMAP_CHILD="+filepath.Join(mnt, "x"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// TestMmapChild is TestMmapSeesOwnWrites's child process.
func TestMmapChild(t *testing.T) {
	path, ok := os.LookupEnv("POWERFS_MMAP_CHILD")
	if !ok {
		t.Skip("the child process of TestMmapSeesOwnWrites")
	}
	const ps, npages = 8192, 1024
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, ps*npages), 0); err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, ps*npages, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	var stop atomic.Bool
	var cur atomic.Int64 // the page being written
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop.Store(true)
	wg.Add(3)
	go func() { // opens, as a checkpoint reading the meta page back does
		defer wg.Done()
		b := make([]byte, 80)
		for !stop.Load() {
			if g, err := os.Open(path); err == nil {
				_, _ = g.ReadAt(b, 0)
				g.Close()
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	var sink atomic.Uint64
	for r := 0; r < 2; r++ { // readers faulting pages in near the writes
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			for !stop.Load() {
				sink.Add(uint64(m[(int(cur.Load())+rng.IntN(3))*ps+16]))
			}
		}()
	}
	seq := make([]uint64, npages)
	rng := rand.New(rand.NewPCG(1, 2))
	deadline := time.Now().Add(10 * time.Second)
	writes := 0
	for ; time.Now().Before(deadline); writes++ {
		p, k := rng.IntN(npages-3), 1+rng.IntN(3) // runs of 1 to 3 pages
		cur.Store(int64(p))
		buf := make([]byte, k*ps)
		for j := 0; j < k; j++ {
			seq[p+j]++
			binary.LittleEndian.PutUint64(buf[j*ps+8:], seq[p+j])
		}
		if _, err := f.WriteAt(buf, int64(p)*ps); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < k; j++ {
			if got := binary.LittleEndian.Uint64(m[(p+j)*ps+8:]); got != seq[p+j] {
				t.Fatalf("write %d: page %d reads version %d through the mmap right after version %d was written", writes, p+j, got, seq[p+j])
			}
		}
		if q := rng.IntN(npages); binary.LittleEndian.Uint64(m[q*ps+8:]) != seq[q] {
			t.Fatalf("write %d: page %d reads version %d through the mmap, version %d was written last",
				writes, q, binary.LittleEndian.Uint64(m[q*ps+8:]), seq[q])
		}
	}
	fmt.Printf("%d writes read back through the mmap, none stale\n", writes)
}
