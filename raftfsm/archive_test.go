package raftfsm

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
)

// TestRestoreArchiveRefuses: an archive whose manifest is missing, of
// another format, without the metadata group first, naming a group twice,
// with a bad group id, or whose files do not match it, is not restored
// (fsm.ErrNotBackup) and leaves the data dir empty.
func TestRestoreArchiveRefuses(t *testing.T) {
	type entry struct{ name, body string }
	archive := func(es ...entry) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range es {
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	const one = `{"mqd_backup":2,"groups":[{"id":"default","file":"default.db","size":4}]}`
	cases := map[string][]byte{
		"no manifest":      archive(entry{"default.db", "abcd"}),
		"other format":     archive(entry{manifestName, `{"mqd_backup":3,"groups":[{"id":"default","file":"default.db","size":4}]}`}, entry{"default.db", "abcd"}),
		"not json":         archive(entry{manifestName, `{"mqd_backup":`}),
		"no default first": archive(entry{manifestName, `{"mqd_backup":2,"groups":[{"id":"g1","file":"g1.db","size":4}]}`}, entry{"g1.db", "abcd"}),
		"group twice": archive(entry{manifestName, `{"mqd_backup":2,"groups":[{"id":"default","file":"a.db","size":1},` +
			`{"id":"g1","file":"b.db","size":1},{"id":"g1","file":"c.db","size":1}]}`}),
		"bad group id":         archive(entry{manifestName, `{"mqd_backup":2,"groups":[{"id":"default","file":"a.db","size":1},{"id":"../x","file":"b.db","size":1}]}`}),
		"file not listed":      archive(entry{manifestName, one}, entry{"other.db", "abcd"}),
		"file of another size": archive(entry{manifestName, one}, entry{"default.db", "abc"}),
		"files missing":        archive(entry{manifestName, one}),
		"not a state file":     archive(entry{manifestName, one}, entry{"default.db", "abcd"}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "new")
			_, err := PrepareRestore(dir, bytes.NewReader(b), "r1", "127.0.0.1:9")
			if !errors.Is(err, fsm.ErrNotBackup) {
				t.Fatalf("PrepareRestore: %v, want %v", err, fsm.ErrNotBackup)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("a refused restore left %d files", len(ents))
			}
		})
	}
}

// mustStateFile is the state file of a state machine that applied cmds,
// as a backup copies it.
func mustStateFile(t *testing.T, cmds ...*command.Command) []byte {
	t.Helper()
	f, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "state.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, c := range cmds {
		if r, _ := f.Apply(&raft.Log{Index: uint64(i + 1), Term: 2, Type: raft.LogCommand, Data: c.Encode()}).(*fsm.Result); r == nil || r.Err != nil {
			t.Fatalf("apply %s: %+v", c.Op, r)
		}
	}
	b, err := f.Backup(t.TempDir(), func(int64) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer b.File.Close()
	out, err := io.ReadAll(b.File)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRestoreArchiveHostile: an archive that a well-formed one turns into
// by a hostile or broken hand is refused and leaves the data dir empty: an
// entry there twice or not in the manifest after the manifest's files, a
// file name with a directory in it, an entry that is a link or a sparse
// file, files larger than the free space. The well-formed one restores.
func TestRestoreArchiveHostile(t *testing.T) {
	node := &command.Command{Op: command.OpSetNode, Now: 1, Node: command.NodeInfo{ID: "n1"}}
	meta := mustStateFile(t, node,
		&command.Command{Op: command.OpSetFormat, Now: 1, Format: fsm.DirectoryFormat},
		&command.Command{Op: command.OpCreateGroup, Now: 1, Group: "g1", Members: []string{"n1", "n2", "n3"}},
		&command.Command{Op: command.OpPlaceTopic, Now: 1, Topic: "t1", Group: "g1"})
	g1 := mustStateFile(t, node)
	type entry struct {
		name string
		body []byte
		hdr  func(*tar.Header)
	}
	manifest := func(metaName string, metaSize int64, g1Size int64) entry {
		m := ArchiveManifest{Format: ArchiveFormat, Groups: []ArchiveGroup{
			{ID: "default", File: metaName, Size: metaSize},
			{ID: "g1", File: "g1.db", Size: g1Size, Members: []string{"n1", "n2", "n3"}}}}
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return entry{name: manifestName, body: js}
	}
	good := []entry{manifest("default.db", int64(len(meta)), int64(len(g1))), {name: "default.db", body: meta}, {name: "g1.db", body: g1}}
	archive := func(es ...entry) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range es {
			h := &tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
			if e.hdr != nil {
				e.hdr(h)
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.body); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	restore := func(b []byte) (*Restored, error) {
		dir := filepath.Join(t.TempDir(), "new")
		res, err := PrepareRestore(dir, bytes.NewReader(b), "r1", "127.0.0.1:9")
		if ents, _ := os.ReadDir(dir); err != nil && len(ents) != 0 {
			t.Errorf("a refused restore left %d files", len(ents))
		}
		return res, err
	}
	if res, err := restore(archive(good...)); err != nil || res.Groups["g1"] != 1 || res.Index != 4 {
		t.Fatalf("the well-formed archive: %+v, %v", res, err)
	}
	// A sparse file: the writer refuses GNU.sparse records, so they are
	// written under another name of the same length and renamed after.
	sparse := archive(manifest("default.db", int64(len(meta)), 1<<20), entry{name: "default.db", body: meta},
		entry{name: "g1.db", hdr: func(h *tar.Header) {
			h.PAXRecords = map[string]string{"XYZ.sparse.major": "0", "XYZ.sparse.minor": "1",
				"XYZ.sparse.size": "1048576", "XYZ.sparse.numblocks": "1", "XYZ.sparse.map": "0,0"}
		}})
	// So many files of the largest size that twice their total wraps
	// around a uint64 (to 0, were it summed first: 8192 × 2 × 2^50 = 2^64).
	manyGroups := func(n int, size int64) entry {
		m := ArchiveManifest{Format: ArchiveFormat, Groups: []ArchiveGroup{{ID: "default", File: "default.db", Size: size}}}
		for i := 1; i < n; i++ {
			m.Groups = append(m.Groups, ArchiveGroup{ID: fmt.Sprint("g", i), File: fmt.Sprint("g", i, ".db"), Size: size})
		}
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return entry{name: manifestName, body: js}
	}
	sparse = bytes.ReplaceAll(sparse, []byte("XYZ.sparse."), []byte("GNU.sparse."))
	symlink := func(h *tar.Header) { h.Typeflag, h.Linkname = tar.TypeSymlink, "/etc/passwd" }
	cases := map[string]struct {
		archive []byte
		want    error
		says    string
	}{
		"an entry twice": {archive: archive(append(good, good[2])...), want: fsm.ErrNotBackup, says: `"g1.db" follows`},
		"an entry not in the manifest": {archive: archive(append(good, entry{name: "extra", body: []byte("x")})...),
			want: fsm.ErrNotBackup, says: `"extra" follows`},
		"a file name with a directory": {archive: archive(manifest("../default.db", int64(len(meta)), int64(len(g1))),
			entry{name: "../default.db", body: meta}, good[2]), want: fsm.ErrNotBackup, says: "not a plain file name"},
		"a link": {archive: archive(manifest("default.db", int64(len(meta)), 0), good[1], entry{name: "g1.db", hdr: symlink}),
			want: fsm.ErrNotBackup, says: "not a regular file"},
		"a sparse file": {archive: sparse, want: fsm.ErrNotBackup, says: "not a regular file"},
		"larger than the free space": {archive: archive(manifest("default.db", 1<<49, int64(len(g1)))),
			want: ErrInsufficientStorage, says: "need"},
		"sizes that wrap around": {archive: archive(manyGroups(8192, 1<<50)), want: ErrInsufficientStorage, says: "need"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := restore(c.archive)
			if !errors.Is(err, c.want) || !strings.Contains(fmt.Sprint(err), c.says) {
				t.Fatalf("PrepareRestore: %v, want %v saying %q", err, c.want, c.says)
			}
		})
	}
}

// TestRestoreDamagedState: a state file with a damaged page, on which
// bbolt panics for some pages, is refused (fsm.ErrNotBackup) and leaves
// the data dir empty, or, where the damage is in a page the state does
// not use, restored; mqd restore never crashes on it.
func TestRestoreDamagedState(t *testing.T) {
	st := mustStateFile(t, &command.Command{Op: command.OpSetNode, Now: 1, Node: command.NodeInfo{ID: "n1"}})
	const page = 4096
	refused := 0
	for pg := 2; (pg+1)*page <= len(st); pg++ { // pages 0 and 1 are the meta pages
		b := bytes.Clone(st)
		for i := pg * page; i < (pg+1)*page; i++ {
			b[i] = 0xa5
		}
		dir := filepath.Join(t.TempDir(), "new")
		_, err := PrepareRestore(dir, bytes.NewReader(b), "r1", "127.0.0.1:9")
		if err == nil {
			continue
		}
		refused++
		if !errors.Is(err, fsm.ErrNotBackup) {
			t.Errorf("page %d damaged: %v, want %v", pg, err, fsm.ErrNotBackup)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("page %d damaged: a refused restore left %d files", pg, len(ents))
		}
	}
	if refused == 0 {
		t.Fatal("no damaged page was refused: the test damages nothing the state uses")
	}
}
