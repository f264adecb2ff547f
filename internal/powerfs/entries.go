package powerfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// entryOp is one journaled directory entry operation, with what undoes it.
// Paths are relative to the backing directory.
type entryOp struct {
	kind  string // "create", "remove", "rmdir", "rename"
	path  string // the entry created or removed; a rename's source
	to    string // a rename's target
	attic string // where a removed or replaced entry waits (absolute)
	mode  uint32 // an removed directory's permissions
}

func (p *FS) abs(rel string) string { return filepath.Join(p.backing, rel) }

func (p *FS) nextAttic() string {
	p.atticSeq++
	return filepath.Join(p.attic, fmt.Sprint(p.atticSeq))
}

// commit makes every journaled entry operation durable: a directory fsync.
func (p *FS) commit() syscall.Errno {
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	for _, op := range p.journal {
		if op.attic != "" {
			if err := os.RemoveAll(op.attic); err != nil {
				return errno(err)
			}
		}
	}
	p.journal = nil
	return 0
}

// rollbackEntries undoes the journal, newest first.
func (p *FS) rollbackEntries(r *Report) error {
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	var errs []error
	for i := len(p.journal) - 1; i >= 0; i-- {
		op := p.journal[i]
		if err := p.undo(op); err != nil {
			errs = append(errs, fmt.Errorf("undo %s %s: %w", op.kind, op.path, err))
		}
		r.Entries++
	}
	p.journal = nil
	return errors.Join(errs...)
}

func (p *FS) undo(op entryOp) error {
	switch op.kind {
	case "create":
		return os.RemoveAll(p.abs(op.path))
	case "remove":
		return os.Rename(op.attic, p.abs(op.path))
	case "rmdir":
		return os.Mkdir(p.abs(op.path), os.FileMode(op.mode))
	case "rename":
		if err := os.Rename(p.abs(op.to), p.abs(op.path)); err != nil {
			return err
		}
		if op.attic != "" {
			return os.Rename(op.attic, p.abs(op.to))
		}
		return nil
	}
	return fmt.Errorf("unknown operation %q", op.kind)
}

// node is a loopback node whose entry operations, opens and size changes go
// through the model.
type node struct {
	*fs.LoopbackNode
	p *FS
}

var (
	_ fs.NodeWrapChilder     = (*node)(nil)
	_ fs.NodeCreater         = (*node)(nil)
	_ fs.NodeRenamer         = (*node)(nil)
	_ fs.NodeOpendirHandler  = (*node)(nil)
	_ fs.NodeSetattrer       = (*node)(nil)
	_ fs.NodeCopyFileRanger  = (*node)(nil)
	_ fs.FileFsyncdirer      = (*dir)(nil)
	_ fs.FileReaddirenter    = (*dir)(nil)
	_ fs.FileReleasedirer    = (*dir)(nil)
	_ fs.FileSeekdirer       = (*dir)(nil)
	_ fs.FileWriter          = (*file)(nil)
	_ fs.FilePassthroughFder = (*file)(nil)
)

// WrapChild makes every node of the tree a powerfs node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), p: n.p}
}

// rel is the backing path of name in n, relative to the backing directory.
func (n *node) rel(name string) string {
	return filepath.Join(n.Path(n.RootData.RootNode.EmbeddedInode()), name)
}

// created runs a creating operation and journals it when it succeeds.
func (n *node) created(name string, do func() (*fs.Inode, syscall.Errno)) (*fs.Inode, syscall.Errno) {
	n.p.metaMu.Lock()
	defer n.p.metaMu.Unlock()
	ch, e := do()
	if e == 0 {
		n.p.journal = append(n.p.journal, entryOp{kind: "create", path: n.rel(name)})
	}
	return ch, e
}

// Mkdir implements fs.NodeMkdirer.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

// Mknod implements fs.NodeMknoder.
func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

// Symlink implements fs.NodeSymlinker.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

// Link implements fs.NodeLinker.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if t, ok := target.(*node); ok {
		target = t.LoopbackNode
	}
	return n.created(name, func() (*fs.Inode, syscall.Errno) { return n.LoopbackNode.Link(ctx, target, name, out) })
}

// Create implements fs.NodeCreater. O_TRUNC of an existing file goes
// through the model.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	n.p.metaMu.Lock()
	_, err := os.Lstat(n.p.abs(n.rel(name)))
	existed := err == nil
	ch, fh, fflags, e := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
	if e == 0 && !existed {
		n.p.journal = append(n.p.journal, entryOp{kind: "create", path: n.rel(name)})
	}
	n.p.metaMu.Unlock()
	if e != 0 {
		return nil, nil, 0, e
	}
	f, e := n.p.wrap(fh)
	if e == 0 && existed && flags&syscall.O_TRUNC != 0 {
		e = n.p.truncate(f.fd, 0, func() syscall.Errno { return errno(syscall.Ftruncate(f.fd, 0)) })
		out.Attr.Size = 0
	}
	if e != 0 {
		fh.(fs.FileReleaser).Release(ctx)
		return nil, nil, 0, e
	}
	return ch, f, fflags | keepCache, 0
}

// Open implements fs.NodeOpener.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fflags, e := n.LoopbackNode.Open(ctx, flags&^syscall.O_TRUNC)
	if e != 0 {
		return nil, 0, e
	}
	f, e := n.p.wrap(fh)
	if e == 0 && flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		e = n.p.truncate(f.fd, 0, func() syscall.Errno { return errno(syscall.Ftruncate(f.fd, 0)) })
	}
	if e != 0 {
		fh.(fs.FileReleaser).Release(ctx)
		return nil, 0, e
	}
	return f, fflags | keepCache, 0
}

// Setattr implements fs.NodeSetattrer: a size change goes through the model.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if f, ok := fh.(*file); ok {
		fh = f.LoopbackFile
	}
	size, ok := in.GetSize()
	if !ok {
		return n.LoopbackNode.Setattr(ctx, fh, in, out)
	}
	f, err := os.OpenFile(n.p.abs(n.rel("")), os.O_RDWR, 0)
	if err != nil {
		return errno(err)
	}
	defer f.Close()
	return n.p.truncate(int(f.Fd()), int64(size), func() syscall.Errno { return n.LoopbackNode.Setattr(ctx, fh, in, out) })
}

// CopyFileRange implements fs.NodeCopyFileRanger: not supported, so that
// the kernel copies with reads and writes, which the model sees.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, len uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

// Unlink implements fs.NodeUnlinker: the file waits in the attic.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	n.p.metaMu.Lock()
	defer n.p.metaMu.Unlock()
	rel := n.rel(name)
	st, err := os.Lstat(n.p.abs(rel))
	if err != nil {
		return errno(err)
	}
	if st.IsDir() {
		return syscall.EISDIR
	}
	attic := n.p.nextAttic()
	if err := os.Rename(n.p.abs(rel), attic); err != nil {
		return errno(err)
	}
	n.p.journal = append(n.p.journal, entryOp{kind: "remove", path: rel, attic: attic})
	return 0
}

// Rmdir implements fs.NodeRmdirer.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	n.p.metaMu.Lock()
	defer n.p.metaMu.Unlock()
	rel := n.rel(name)
	st, err := os.Lstat(n.p.abs(rel))
	if err != nil {
		return errno(err)
	}
	if err := syscall.Rmdir(n.p.abs(rel)); err != nil {
		return errno(err)
	}
	n.p.journal = append(n.p.journal, entryOp{kind: "rmdir", path: rel, mode: uint32(st.Mode().Perm())})
	return 0
}
