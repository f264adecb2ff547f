package raftfsm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// fsm.db is written without fsync (see ARCHITECTURE.md, "Durability
// argument"). A process crash loses nothing of it: bbolt's committed pages
// are in the kernel's page cache, which outlives the process, and a
// transaction cut short never became visible. A power loss or kernel crash
// can leave the file torn, though: the meta page may reach the disk before
// the pages it points at. The state file next to it tells the two apart.
// It holds "clean" after a clean close (which fsyncs fsm.db first) and
// "open <boot id>" while the FSM is open; it is rewritten durably (temp
// file, fsync, rename, fsync of the directory) before fsm.db is written.
// At open, fsm.db is trusted when the state says clean, or open in this
// same boot of the kernel (only the process died); otherwise it is
// discarded and rebuilt from the latest snapshot and the raft log, as a
// node whose disk was wiped would be.
const (
	fsmStateSuffix = ".state"
	stateClean     = "clean"
	stateOpenPfx   = "open "
)

// bootIDPath is where Linux exposes a random id drawn at every boot.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID is this boot's id, or "" where the system has none; without one
// a crash of the process cannot be told from a power loss, and only a
// clean close keeps fsm.db.
func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// fsmTrusted reports whether the fsm.db at path may be used as it is,
// and why (for the log).
func fsmTrusted(path string) (bool, string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, "no state file yet", nil
	}
	b, err := os.ReadFile(path + fsmStateSuffix)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Written by mqd before the durable FSM, which rebuilt it at
		// every start and never fsynced it.
		return false, "no record of how it was closed", nil
	case err != nil:
		return false, "", fmt.Errorf("fsm state: %w", err)
	}
	s := string(bytes.TrimSpace(b))
	switch {
	case s == stateClean:
		return true, "closed cleanly", nil
	case strings.HasPrefix(s, stateOpenPfx):
		if id := bootID(); id != "" && s[len(stateOpenPfx):] == id {
			return true, "the process stopped without closing it, in this boot", nil
		}
		return false, "open when the machine stopped (power loss or kernel crash): it may be torn", nil
	default:
		return false, "unreadable state file", nil
	}
}

// writeFSMState replaces the state file durably.
func writeFSMState(path, state string) error {
	return writeFileSync(path+fsmStateSuffix, []byte(state+"\n"))
}

// writeFileSync writes name through a temporary file that is fsynced and
// renamed over it, then fsyncs the directory so the rename is durable.
func writeFileSync(name string, data []byte) error {
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
	return syncDir(filepath.Dir(name))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
