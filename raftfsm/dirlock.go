package raftfsm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrDataDirLocked means another process holds the data dir's lock.
var ErrDataDirLocked = errors.New("data dir is in use by another mqd process")

// lockFileName is the file in the data dir that one process at a time
// holds an exclusive flock on; it contains the holder's pid.
const lockFileName = "mqd.lock"

// dirLock is a held data dir lock. The kernel drops it when the process
// exits, however it exits, so a crash never leaves a stale lock behind.
type dirLock struct{ f *os.File }

// lockDataDir takes the data dir's exclusive lock, or fails at once with
// ErrDataDirLocked naming the holder's pid. It must come before the node
// touches any other file of the dir: a second process on a running node's
// dir would otherwise replace files under it.
func lockDataDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(holder))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("%w: %s is locked by pid %s (lock file %s)", ErrDataDirLocked, dir, pid, path)
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

// release drops the lock (closing the file releases the flock).
func (l *dirLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
