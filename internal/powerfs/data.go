package powerfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// blockSize is the unit in which overwritten data is kept aside.
const blockSize = 4096

// maxRun bounds the run of consecutive writes a torn cut keeps a prefix of.
const maxRun = 1 << 20

// fileKey names a backing file by its inode, which renames do not change.
type fileKey struct{ dev, ino uint64 }

// dirtyFile is a file with changes since its last fsync: what a cut must
// put back.
type dirtyFile struct {
	f       *os.File         // the backing file, opened read-write for the rollback
	size    int64            // size at the last fsync
	saved   map[int64][]byte // block index → its content at the last fsync (blocks below size)
	lastOff int64            // the last run of unsynced writes, for a torn cut
	last    []byte
}

func keyOf(fd int) (fileKey, int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileKey{}, 0, err
	}
	return fileKey{uint64(st.Dev), st.Ino}, st.Size, nil
}

// dirty returns fd's record, creating it (the file is clean: its current
// size is its synced size) on its first change. p.dataMu is held.
func (p *FS) dirty(fd int) (*dirtyFile, error) {
	k, size, err := keyOf(fd)
	if err != nil {
		return nil, err
	}
	if d := p.files[k]; d != nil {
		return d, nil
	}
	// A descriptor of our own, read-write whatever fd's mode, alive until the
	// file is synced or the power is cut.
	f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	d := &dirtyFile{f: f, size: size, saved: map[int64][]byte{}}
	p.files[k] = d
	return d, nil
}

// save keeps aside the synced content of the blocks that [off, end) is about
// to change. p.dataMu is held.
func (p *FS) save(fd int, off, end int64) (*dirtyFile, error) {
	d, err := p.dirty(fd)
	if err != nil {
		return nil, err
	}
	end = min(end, d.size)
	for b := off / blockSize; b*blockSize < end; b++ {
		if _, ok := d.saved[b]; ok {
			continue
		}
		buf := make([]byte, min(blockSize, d.size-b*blockSize))
		n, err := d.f.ReadAt(buf, b*blockSize)
		if n < len(buf) && err != nil {
			return nil, fmt.Errorf("save block %d: %w", b, err)
		}
		d.saved[b] = buf
	}
	return d, nil
}

// write is a pwritev through the model.
func (p *FS) write(fd int, iov [][]byte, off int64) (uint32, syscall.Errno) {
	total := 0
	for _, b := range iov {
		total += len(b)
	}
	p.dataMu.Lock()
	defer p.dataMu.Unlock()
	d, err := p.save(fd, off, off+int64(total))
	if err != nil {
		return 0, errno(err)
	}
	n, err := unix.Pwritev(fd, iov, off)
	if n > 0 {
		// A write that continues the last one (an append, or the kernel's
		// pieces of one large write) extends it, up to maxRun.
		if off != d.lastOff+int64(len(d.last)) || len(d.last)+n > maxRun {
			d.lastOff, d.last = off, d.last[:0]
		}
		start := len(d.last)
		for _, b := range iov {
			k := min(len(b), start+n-len(d.last))
			d.last = append(d.last, b[:k]...)
		}
	}
	return uint32(max(n, 0)), errno(err)
}

// truncate is an ftruncate through the model.
func (p *FS) truncate(fd int, size int64, do func() syscall.Errno) syscall.Errno {
	p.dataMu.Lock()
	defer p.dataMu.Unlock()
	if _, err := p.save(fd, size, 1<<62); err != nil {
		return errno(err)
	}
	return do()
}

// synced forgets fd's unsynced changes: they are durable now.
func (p *FS) synced(fd int) syscall.Errno {
	k, _, err := keyOf(fd)
	if err != nil {
		return errno(err)
	}
	p.dataMu.Lock()
	if d := p.files[k]; d != nil {
		d.f.Close()
		delete(p.files, k)
	}
	p.dataMu.Unlock()
	if p.opts.FileSyncCommitsEntries {
		return p.commit()
	}
	return 0
}

// rollbackData puts back every dirty file's synced content and size, then,
// if torn, a prefix of its last unsynced write.
func (p *FS) rollbackData(torn bool, r *Report) error {
	p.dataMu.Lock()
	defer p.dataMu.Unlock()
	var first error
	for k, d := range p.files {
		if err := p.rollbackFile(d, torn, r); err != nil && first == nil {
			first = err
		}
		d.f.Close()
		delete(p.files, k)
	}
	return first
}

func (p *FS) rollbackFile(d *dirtyFile, torn bool, r *Report) error {
	r.Files++
	name, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", d.f.Fd()))
	if rel, rerr := filepath.Rel(p.backing, name); err == nil && rerr == nil {
		name = rel
	}
	if torn && len(d.last) > 1 {
		name += " (torn)"
	}
	r.Names = append(r.Names, name)
	st, err := d.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > d.size {
		r.Bytes += st.Size() - d.size
	}
	for b, buf := range d.saved {
		if _, err := d.f.WriteAt(buf, b*blockSize); err != nil {
			return err
		}
		r.Bytes += int64(len(buf))
	}
	if err := d.f.Truncate(d.size); err != nil {
		return err
	}
	if torn && len(d.last) > 1 {
		keep := 1 + p.rng.IntN(len(d.last)-1)
		if _, err := d.f.WriteAt(d.last[:keep], d.lastOff); err != nil {
			return err
		}
		r.Torn++
	}
	return nil
}

// file is an open backing file whose writes, syncs and allocations go
// through the model.
type file struct {
	*fs.LoopbackFile
	p  *FS
	fd int
}

func (p *FS) wrap(fh fs.FileHandle) (*file, syscall.Errno) {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return nil, syscall.EIO
	}
	fd, ok := lf.PassthroughFd()
	if !ok {
		return nil, syscall.EBADF
	}
	return &file{LoopbackFile: lf, p: p, fd: fd}, 0
}

// PassthroughFd hides the backing descriptor from the kernel: with FUSE
// passthrough, writes would bypass the model.
func (f *file) PassthroughFd() (int, bool) { return 0, false }

// Write implements fs.FileWriter.
func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return f.p.write(f.fd, [][]byte{data}, off)
}

// Writev implements fs.FileWritever.
func (f *file) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	return f.p.write(f.fd, data, off)
}

// Fsync implements fs.FileFsyncer: fsync and fdatasync make the file's data
// durable. The backing file is not synced (the machine does not lose power).
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.p.synced(f.fd)
}

// Allocate implements fs.FileAllocater.
func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
		return syscall.EOPNOTSUPP
	}
	f.p.dataMu.Lock()
	defer f.p.dataMu.Unlock()
	end := int64(off)
	if mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0 {
		end = int64(off + size)
	}
	if _, err := f.p.save(f.fd, int64(off), end); err != nil {
		return errno(err)
	}
	return errno(unix.Fallocate(f.fd, mode, int64(off), int64(size)))
}

// keepCache keeps the kernel's page cache of a file across opens. FUSE
// otherwise drops a file's cached pages at every open (and, with automatic
// invalidation, whenever its mtime moved): a write's pages are in the cache
// and unlocked before the server has written them, so a drop while a write
// is in flight lets a read-ahead or an mmap fault cache the server's older
// bytes, and the writer then reads a stale page of its own file — which no
// local filesystem does (bbolt, reading older copies of pages it had just
// written, freed pages twice: "page N already freed"). The mount also turns
// the automatic invalidation off (ExplicitDataCacheControl). Every change to
// a file's data goes through this mount's kernel, which keeps its cache
// coherent with them; the backing files change behind it only at a cut,
// while unmounted, and a new mount has a new cache.
const keepCache = fuse.FOPEN_KEEP_CACHE
