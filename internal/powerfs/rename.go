package powerfs

import (
	"context"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Rename implements fs.NodeRenamer. A replaced target waits in the attic (a
// file as a hard link, so that the rename stays atomic for readers).
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.p != n.p {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE, RENAME_WHITEOUT: not modelled
	}
	n.p.metaMu.Lock()
	defer n.p.metaMu.Unlock()
	from, to := n.rel(name), np.rel(newName)
	src, err := os.Lstat(n.p.abs(from))
	if err != nil {
		return errno(err)
	}
	op := entryOp{kind: "rename", path: from, to: to}
	dst, err := os.Lstat(n.p.abs(to))
	switch {
	case err == nil && flags&unix.RENAME_NOREPLACE != 0:
		return syscall.EEXIST
	case err == nil && os.SameFile(src, dst):
		return 0
	case err == nil:
		if e := n.setAside(src, dst, to, &op); e != 0 {
			return e
		}
	case !os.IsNotExist(err):
		return errno(err)
	}
	if err := os.Rename(n.p.abs(from), n.p.abs(to)); err != nil {
		if op.attic != "" && dst.IsDir() {
			os.Rename(op.attic, n.p.abs(to))
		} else if op.attic != "" {
			os.Remove(op.attic)
		}
		return errno(err)
	}
	n.p.journal = append(n.p.journal, op)
	return 0
}

// setAside keeps the entry a rename replaces in the attic.
func (n *node) setAside(src, dst os.FileInfo, to string, op *entryOp) syscall.Errno {
	op.attic = n.p.nextAttic()
	switch {
	case src.IsDir() && !dst.IsDir():
		return syscall.ENOTDIR
	case !src.IsDir() && dst.IsDir():
		return syscall.EISDIR
	case dst.IsDir():
		ents, err := os.ReadDir(n.p.abs(to))
		if err != nil {
			return errno(err)
		}
		if len(ents) > 0 {
			return syscall.ENOTEMPTY
		}
		return errno(os.Rename(n.p.abs(to), op.attic))
	}
	return errno(os.Link(n.p.abs(to), op.attic))
}

// OpendirHandle implements fs.NodeOpendirHandler: the handle's fsync is a
// directory fsync of the model.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fflags, e := n.LoopbackNode.OpendirHandle(ctx, flags)
	if e != 0 {
		return nil, 0, e
	}
	return &dir{inner: fh, p: n.p}, fflags, 0
}

// dir is an open directory.
type dir struct {
	inner fs.FileHandle
	p     *FS
}

// Fsyncdir implements fs.FileFsyncdirer: every entry operation so far is
// durable.
func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno { return d.p.commit() }

// Readdirent implements fs.FileReaddirenter.
func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	r, ok := d.inner.(fs.FileReaddirenter)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	return r.Readdirent(ctx)
}

// Seekdir implements fs.FileSeekdirer.
func (d *dir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	s, ok := d.inner.(fs.FileSeekdirer)
	if !ok {
		return syscall.ENOTSUP
	}
	return s.Seekdir(ctx, off)
}

// Releasedir implements fs.FileReleasedirer.
func (d *dir) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.inner.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
	}
}
