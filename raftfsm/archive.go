package raftfsm

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/replica"
)

// A backup of a cluster with data groups (GET /v1/cluster/backup) is a tar
// archive: manifest.json first, then one state file per group, the
// metadata group's ("default") and every data group's, each a consistent
// copy of that group's state at its own applied index (there is no
// cross-group point in time). A backup without data groups stays one
// bbolt file, as before; PrepareRestore reads both.

// ArchiveFormat is the manifest's mqd_backup: the archive's format.
const ArchiveFormat = 2

const manifestName = "manifest.json"

// ArchiveManifest describes an archive's files.
type ArchiveManifest struct {
	Format int            `json:"mqd_backup"`
	Node   string         `json:"node"`   // the node that answered the backup
	Taken  time.Time      `json:"taken"`  // when it began
	Groups []ArchiveGroup `json:"groups"` // "default" first, then the data groups by id
	Note   string         `json:"note,omitempty"`
}

// ArchiveGroup is one group's state file in an archive.
type ArchiveGroup struct {
	ID           string `json:"id"`
	File         string `json:"file"`
	AppliedIndex uint64 `json:"applied_index"`
	Size         int64  `json:"size"`
	From         string `json:"from"` // the node whose replica was copied
	// Members: a data group's members as the directory recorded them
	// (a restore grows the group back to as many).
	Members []string `json:"members,omitempty"`
}

// ArchivePart is a group's copy on its way into an archive.
type ArchivePart struct {
	ArchiveGroup
	Data *os.File // at its start; WriteArchive closes it
}

// WriteArchive writes the manifest and the parts (closing each) to w.
func WriteArchive(w io.Writer, node string, taken time.Time, parts []ArchivePart) (err error) {
	defer func() {
		for _, p := range parts {
			p.Data.Close()
		}
	}()
	m := ArchiveManifest{Format: ArchiveFormat, Node: node, Taken: taken.UTC(),
		Note: "each group's state is consistent at its own applied index; restore with mqd restore"}
	for _, p := range parts {
		m.Groups = append(m.Groups, p.ArchiveGroup)
	}
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	hdr := func(name string, size int64) error {
		return tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: taken, Typeflag: tar.TypeReg, Format: tar.FormatPAX})
	}
	if err := hdr(manifestName, int64(len(js))); err != nil {
		return err
	}
	if _, err := tw.Write(js); err != nil {
		return err
	}
	for _, p := range parts {
		if err := hdr(p.File, p.Size); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, p.Data, p.Size); err != nil {
			return fmt.Errorf("backup of group %s: %w", p.ID, err)
		}
	}
	return tw.Close()
}

// isArchive reports whether the first bytes of a backup are a tar
// header's (a state file starts with a bbolt page).
func isArchive(head []byte) bool {
	return len(head) >= 262 && string(head[257:262]) == "ustar"
}

// restoreArchive is PrepareRestore of an archive: the metadata group's
// state goes where a single-group restore puts it, each data group's into
// groups/<id>/ as a snapshot with the one voter (id, raftAddr), and the
// metadata's directory names that node the only member of every group.
func restoreArchive(dataDir string, r io.Reader, id, raftAddr string) (*Restored, error) {
	tr := tar.NewReader(r)
	m, err := readManifest(tr)
	if err != nil {
		return nil, err
	}
	if err := archiveRoom(dataDir, m); err != nil {
		return nil, err
	}
	files, err := spoolArchive(tr, m, dataDir)
	defer func() {
		for _, f := range files {
			os.Remove(f)
		}
	}()
	if err != nil {
		return nil, err
	}
	out := &Restored{Groups: map[string]uint64{}}
	groups := map[string]fsm.RestoredGroup{}
	for _, g := range m.Groups {
		index, err := fsm.PrepareState(files[g.File], restoredTerm)
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", g.ID, err)
		}
		if g.ID == replica.DefaultGroup {
			out.Index = index
			continue
		}
		out.Groups[g.ID] = index
		topics, err := fsm.StateTopics(files[g.File])
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", g.ID, err)
		}
		groups[g.ID] = fsm.RestoredGroup{Topics: topics, Want: len(g.Members)}
	}
	meta := files[m.Groups[0].File]
	if err := fsm.RestoreDirectory(meta, id, groups); err != nil {
		return nil, err
	}
	if err := installSnapshot(dataDir, meta, out.Index, id, raftAddr); err != nil {
		return nil, err
	}
	for _, g := range m.Groups[1:] {
		dir, err := replica.GroupDir(dataDir, g.ID)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if err := installSnapshot(dir, files[g.File], out.Groups[g.ID], id, raftAddr); err != nil {
			return nil, fmt.Errorf("group %s: %w", g.ID, err)
		}
	}
	return out, nil
}

// maxManifest bounds an archive's manifest.
const maxManifest = 1 << 20

// readManifest reads and checks the manifest, an archive's first entry.
func readManifest(tr *tar.Reader) (*ArchiveManifest, error) {
	h, err := tr.Next()
	if err != nil || h.Name != manifestName || h.Size > maxManifest || checkEntry(h) != nil {
		return nil, fmt.Errorf("restore: %w: an archive must start with %s", fsm.ErrNotBackup, manifestName)
	}
	var m ArchiveManifest
	if err := json.NewDecoder(io.LimitReader(tr, h.Size)).Decode(&m); err != nil {
		return nil, fmt.Errorf("restore: %w: %s: %w", fsm.ErrNotBackup, manifestName, err)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// archiveRoom refuses, before anything is written, an archive whose files
// would not fit in the free space of the data dir's filesystem: each is
// copied out of the archive, then into its snapshot, so twice their sizes
// (the manifest's, which each entry must match).
func archiveRoom(dataDir string, m *ArchiveManifest) error {
	free, _, err := fsSpace(dataDir)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	var need uint64
	for _, g := range m.Groups {
		// Checked at each file, so that need, at most free plus twice
		// maxStateFile, cannot wrap around however many files there are.
		if need += 2 * uint64(g.Size); need > free {
			return fmt.Errorf("restore: %w: the archive's files need more than the %d bytes free in %s",
				ErrInsufficientStorage, free, dataDir)
		}
	}
	return nil
}

// spoolArchive copies the files of the manifest m from tr, which must hold
// them and nothing else, each once, as a regular file of the size m says,
// into temporary files in dataDir. It answers archive file name → its
// copy, the files copied so far when it fails (the caller removes them).
func spoolArchive(tr *tar.Reader, m *ArchiveManifest, dataDir string) (map[string]string, error) {
	files := map[string]string{}
	for range m.Groups {
		h, err := tr.Next()
		if err != nil {
			return files, fmt.Errorf("restore: %w: the archive ends before its groups' files (%w)", fsm.ErrNotBackup, err)
		}
		g := m.group(h.Name)
		if g == nil || files[h.Name] != "" || h.Size != g.Size {
			return files, fmt.Errorf("restore: %w: file %q is not in the manifest, is there twice or has another size", fsm.ErrNotBackup, h.Name)
		}
		if err := checkEntry(h); err != nil {
			return files, err
		}
		tmp := filepath.Join(dataDir, "restore-"+g.ID+".db.tmp")
		files[h.Name] = tmp
		if err := copyToFile(tmp, io.LimitReader(tr, h.Size)); err != nil {
			return files, err
		}
	}
	switch h, err := tr.Next(); {
	case err == nil:
		return files, fmt.Errorf("restore: %w: file %q follows the manifest's files (not in it, or there twice)", fsm.ErrNotBackup, h.Name)
	case !errors.Is(err, io.EOF):
		return files, fmt.Errorf("restore: %w: after the groups' files: %w", fsm.ErrNotBackup, err)
	}
	return files, nil
}

// checkEntry refuses an archive entry that is not a plain regular file: a
// link, a directory, a device, or a sparse file (whose holes a reader
// would expand into far more than the archive holds).
func checkEntry(h *tar.Header) error {
	sparse := false
	for k := range h.PAXRecords {
		sparse = sparse || strings.HasPrefix(k, "GNU.sparse.")
	}
	if h.Typeflag != tar.TypeReg || sparse {
		return fmt.Errorf("restore: %w: %q is not a regular file", fsm.ErrNotBackup, h.Name)
	}
	return nil
}

// maxStateFile bounds the size a manifest may give a group's file (1 PiB).
const maxStateFile = 1 << 50

// check refuses a manifest this binary cannot restore.
func (m *ArchiveManifest) check() error {
	bad := func(why string) error { return fmt.Errorf("restore: %w: %s", fsm.ErrNotBackup, why) }
	if m.Format != ArchiveFormat {
		return bad(fmt.Sprintf("archive format %d, this binary restores %d", m.Format, ArchiveFormat))
	}
	if len(m.Groups) == 0 || m.Groups[0].ID != replica.DefaultGroup {
		return bad("the manifest's first group is not the metadata group (default)")
	}
	seen := map[string]bool{}
	for _, g := range m.Groups {
		if err := replica.ValidateGroupID(g.ID); err != nil {
			return bad(err.Error())
		}
		if seen[g.ID] || seen["f"+g.File] || g.File == "" || g.File == manifestName || g.Size < 0 || g.Size > maxStateFile {
			return bad(fmt.Sprintf("group %q or file %q twice, empty, or of size %d", g.ID, g.File, g.Size))
		}
		if !plainName(g.File) {
			return bad(fmt.Sprintf("file %q is not a plain file name", g.File))
		}
		seen[g.ID], seen["f"+g.File] = true, true
	}
	return nil
}

// plainName reports whether an archive's file name is one name, with no
// directory: unpacked by hand (tar x), it stays in the current directory.
func plainName(name string) bool {
	return name != "." && name != ".." && !strings.ContainsAny(name, `/\`) && !strings.ContainsRune(name, 0)
}

func (m *ArchiveManifest) group(file string) *ArchiveGroup {
	i := slices.IndexFunc(m.Groups, func(g ArchiveGroup) bool { return g.File == file })
	if i < 0 {
		return nil
	}
	return &m.Groups[i]
}
