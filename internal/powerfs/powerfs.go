// Package powerfs is a power-loss test filesystem: a FUSE passthrough over a
// backing directory that remembers what has not been made durable yet, so
// that a test can cut the power and see what a disk would have kept.
//
// The model is the one of Jepsen's LazyFS, kept to what mqd's durability
// argument relies on:
//
//   - File data: a write reaches the backing file at once (the running
//     processes read their own writes, through read(2) and mmap alike), but
//     the bytes it overwrote are kept aside, block by block, together with the
//     file's size at its last fsync or fdatasync. An fsync forgets them; a cut
//     puts them back and truncates the file to its synced size. A torn cut
//     then writes again a prefix of the file's last run of unsynced writes
//     (its last write, with the writes that continued it: an append, or the
//     pieces the kernel split one write into), as a disk that lost power in
//     the middle of it would have; the earlier unsynced writes stay dropped,
//     a reordering that POSIX allows for data not yet synced.
//   - Directory entries: create, mkdir, mknod, symlink, link, unlink, rmdir
//     and rename are journaled in order; an fsync of a directory makes every
//     entry operation before it durable (ordered metadata, as on a journaling
//     filesystem). A cut undoes, newest first, the operations after the last
//     directory fsync. A removed or replaced file is kept in an attic beside
//     the backing directory until its removal is durable.
//
// A cut unmounts the filesystem (the callers have killed every process that
// used it), rolls the backing directory back, and mounts it again at the same
// path, so the kernel's page cache of the old mount cannot serve dropped data.
// While mounted, the kernel keeps its page cache across opens and mtime
// changes (keepCache): every write goes through it, so it stays coherent, as
// a local filesystem's does. Nothing may write the backing directory while it
// is mounted.
//
// It does not model: other reorderings of a file's unsynced writes (a cut
// keeps none of them, but for the torn prefix of the last run), losing a synced
// write (a disk that lies about fsync), attributes (modes, times, xattrs are
// never rolled back), or, by default, the durability a file fsync gives its
// own directory entry on ext4 (Options.FileSyncCommitsEntries). An fsync is not passed
// to the backing filesystem: the machine itself never loses power.
//
// It is for tests only: it needs root and /dev/fuse, and mounts with
// mount(2) directly (no fusermount).
package powerfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options tune a mount.
type Options struct {
	// Seed seeds the choice of torn prefixes (0: seed 1).
	Seed uint64
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// FileSyncCommitsEntries makes a file's fsync also make every earlier
	// directory entry operation durable, as a journaling filesystem's commit
	// does (ext4's); by default only a directory fsync does, as POSIX asks.
	FileSyncCommitsEntries bool
}

// FS is one mounted power-loss filesystem.
type FS struct {
	backing, mountpoint, attic string
	opts                       Options

	serverMu sync.Mutex
	server   *fuse.Server

	metaMu   sync.Mutex // serializes entry operations with their journal
	journal  []entryOp
	atticSeq int

	dataMu sync.Mutex // serializes writes with the saving of what they overwrite
	files  map[fileKey]*dirtyFile
	rng    *rand.Rand
}

// Report says what a cut dropped.
type Report struct {
	Files   int      // files whose unsynced data was rolled back
	Bytes   int64    // overwritten bytes put back plus bytes truncated off
	Torn    int      // files that kept a prefix of their last run of unsynced writes
	Entries int      // directory entry operations undone
	Names   []string // the rolled-back files, relative to the backing directory, sorted; a torn one ends in " (torn)"
}

func (r Report) String() string {
	return fmt.Sprintf("%d files rolled back (%d bytes, %d torn) %v, %d entry operations undone", r.Files, r.Bytes, r.Torn, r.Names, r.Entries)
}

// Available says why this process cannot mount a powerfs, or nil if it can
// (root and /dev/fuse).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("powerfs needs root (it mounts with mount(2))")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("powerfs needs /dev/fuse: %w", err)
	}
	return nil
}

// Mount serves backingDir at mountpoint (created if missing). A directory
// backingDir+".attic" holds removed files until their removal is durable.
// Everything already in backingDir counts as durable.
func Mount(backingDir, mountpoint string, opts Options) (*FS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	backing, err := filepath.Abs(backingDir)
	if err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	for _, d := range []string{backing, mountpoint} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("powerfs: %w", err)
		}
	}
	attic := backing + ".attic"
	if err := os.RemoveAll(attic); err != nil {
		return nil, fmt.Errorf("powerfs: clear attic: %w", err)
	}
	if err := os.Mkdir(attic, 0o700); err != nil {
		return nil, fmt.Errorf("powerfs: %w", err)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = 1
	}
	p := &FS{backing: backing, mountpoint: mountpoint, attic: attic, opts: opts,
		files: map[fileKey]*dirtyFile{}, rng: rand.New(rand.NewPCG(seed, 0x706f776572))}
	if err := p.mount(); err != nil {
		return nil, err
	}
	return p, nil
}

// Mountpoint is where the filesystem is mounted.
func (p *FS) Mountpoint() string { return p.mountpoint }

// Backing is the directory that holds the files.
func (p *FS) Backing() string { return p.backing }

func (p *FS) mount() error {
	root, err := fs.NewLoopbackRoot(p.backing)
	if err != nil {
		return fmt.Errorf("powerfs: %w", err)
	}
	rn := &node{LoopbackNode: root.(*fs.LoopbackNode), p: p}
	server, err := fs.Mount(p.mountpoint, rn, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMountStrict: true,
		// No invalidation of the page cache when a file's mtime moves:
		// see keepCache.
		ExplicitDataCacheControl: true,
		FsName:                   "powerfs",
		Name:                     "powerfs",
		Debug:                    p.opts.Debug,
	}})
	if err != nil {
		return fmt.Errorf("powerfs: mount %s: %w", p.mountpoint, err)
	}
	p.serverMu.Lock()
	p.server = server
	p.serverMu.Unlock()
	return nil
}

// unmount unmounts, retrying for a while if the mount is still busy (a
// process that was just killed may not have released its files yet).
func (p *FS) unmount() error {
	p.serverMu.Lock()
	defer p.serverMu.Unlock()
	if p.server == nil {
		return nil
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := p.server.Unmount()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("powerfs: unmount %s: %w", p.mountpoint, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.server.Wait()
	p.server = nil
	return nil
}

// Cut is a power cut: it unmounts (every process using the filesystem must
// have been killed), drops every write since its file's last fsync and every
// entry operation since the last directory fsync, keeps a prefix of each
// file's last run of unsynced writes if torn, and mounts again at the same path.
func (p *FS) Cut(torn bool) (Report, error) {
	if err := p.unmount(); err != nil {
		return Report{}, err
	}
	var r Report
	err := p.rollbackData(torn, &r)
	if err2 := p.rollbackEntries(&r); err == nil {
		err = err2
	}
	slices.Sort(r.Names)
	if err != nil {
		return r, fmt.Errorf("powerfs: cut: %w", err)
	}
	return r, p.mount()
}

// Unmount unmounts the filesystem and leaves the backing directory as the
// running processes last saw it (nothing is rolled back).
func (p *FS) Unmount() error {
	if err := p.unmount(); err != nil {
		return err
	}
	p.dataMu.Lock()
	for k, d := range p.files {
		d.f.Close()
		delete(p.files, k)
	}
	p.dataMu.Unlock()
	return os.RemoveAll(p.attic)
}

// errno turns an error into the errno FUSE answers with.
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return fs.ToErrno(err)
}
