package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// child is one broker process (an mqd node or a nats-server node) that this
// program started. Its stdout and stderr go to logPath.
type child struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and been reaped
}

// startChild starts bin with args, output to logPath. The child gets its own
// process group, so a Ctrl-C in the terminal reaches only this program,
// which then stops its children in order; and Pdeathsig, so the child is
// killed when this program dies, even by SIGKILL.
func startChild(name, bin string, args []string, logPath string) (*child, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); lf.Close(); close(c.done) }()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stopChildren sends SIGTERM to every child, waits up to grace for all of
// them to exit, then SIGKILLs those still running and waits for them.
func stopChildren(cs []*child, grace time.Duration) {
	for _, c := range cs {
		if c != nil {
			c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	timeout := time.After(grace)
	for _, c := range cs {
		if c == nil {
			continue
		}
		select {
		case <-c.done:
		case <-timeout:
			for _, k := range cs {
				if k != nil && !k.exited() {
					k.cmd.Process.Kill()
				}
			}
			<-c.done
		}
	}
}

// childPids are the process ids of cs, for pidsCPU.
func childPids(cs []*child) []int {
	pids := make([]int, 0, len(cs))
	for _, c := range cs {
		pids = append(pids, c.pid())
	}
	return pids
}

// logTails is the last lines of each child's log.
func logTails(cs []*child, lines int) string {
	var b strings.Builder
	for _, c := range cs {
		if c == nil {
			continue
		}
		f, err := os.Open(c.logPath)
		if err != nil {
			continue
		}
		var all []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			all = append(all, sc.Text())
		}
		f.Close()
		fmt.Fprintf(&b, "---- %s log, last lines ----\n%s\n", c.name, strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
	return b.String()
}

// linkBinary makes name in dir a symbolic link to bin, so that the processes
// started from it are called name (not "mqd": a `pkill mqd` aimed at
// someone's hand-started cluster leaves them alone).
func linkBinary(bin, dir, name string) (string, error) {
	if err := checkExecutable(bin); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	link := filepath.Join(dir, name)
	if err := os.Symlink(abs, link); err != nil {
		return "", err
	}
	return link, nil
}

// checkExecutable answers an error unless bin is an executable regular file.
func checkExecutable(bin string) error {
	st, err := os.Stat(bin)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", bin)
	}
	return nil
}
