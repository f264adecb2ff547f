package raftfsm

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

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
