// Package durable writes files so that they survive a power cut: fsynced
// contents, renames made durable by fsyncing their directory.
package durable

import (
	"os"
	"path/filepath"
)

// WriteFileSync writes name through a temporary file that is fsynced and
// renamed over it, then fsyncs the directory so the rename is durable.
func WriteFileSync(name string, data []byte) error {
	tmp := name + ".tmp"
	w, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		w.Close()
		return err
	}
	if err := w.Sync(); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(name))
}

// SyncDir fsyncs a directory, so that the entries made or renamed in it
// are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
