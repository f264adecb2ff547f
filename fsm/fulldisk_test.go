package fsm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// A cleanly stopped node opens its state on a full disk: the state file is
// rewritten in place, and nothing else at open needs new space. (It used
// to fail with "write fsm.db.state.tmp: no space left on device".)
func TestFSMOpensOnFullDisk(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mount a tmpfs (needs root): %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	path := filepath.Join(mnt, "fsm.db")
	h := openAt(t, path)
	h.must(setNode("n1"))
	h.must(setNode("n2"))
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	fill, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for _, n := range []int{4096, 512, 1} { // the last bytes too
		for {
			if _, err := fill.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	fill.Close()

	for range 2 { // and again after a stop on the full disk
		h = openAt(t, path)
		if got, n := h.f.AppliedIndex(), len(h.f.Nodes()); got != 2 || n != 2 {
			t.Fatalf("on a full disk: applied index %d, %d nodes; want 2 and 2", got, n)
		}
		if err := h.f.Close(); err != nil {
			t.Fatalf("close on a full disk: %v", err)
		}
	}
}
