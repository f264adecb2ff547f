package testcluster

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
)

// Ports come from below the kernel's ephemeral range (32768+ on Linux), so an
// outgoing connection cannot take a node's port between picking it and the
// node binding it, nor while the node is down for a restart.
//
// go test runs several test binaries at once (./test, ./test/chaos, ...):
// each process takes ports only from blocks of the range it holds an
// exclusive lock on (a lock file per block in the temporary directory,
// held until the process exits), so another process cannot pick the port
// of a node that is down for a restart. (It happened: a chaos run's node
// restarted into "address already in use".)
const (
	portLow   = 20000
	portHigh  = 32000
	portBlock = 400
)

var (
	portsMu sync.Mutex
	used    = map[int]bool{}
	owned   []int      // first ports of the blocks this process holds
	locks   []*os.File // their lock files, open for the process's life
)

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago and has
// not been handed out before in this process.
func freeAddr() (string, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 4 {
		for _, low := range owned {
			for range 200 {
				p := low + rand.IntN(portBlock)
				if used[p] {
					continue
				}
				addr := "127.0.0.1:" + strconv.Itoa(p)
				l, err := net.Listen("tcp", addr)
				if err != nil {
					continue
				}
				l.Close()
				used[p] = true
				return addr, nil
			}
		}
		if err := claimBlock(); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("no free port in the blocks of [%d,%d) this process holds", portLow, portHigh)
}

// claimBlock takes one more block of ports: the first, in a random order,
// whose lock file no other process holds. Where lock files cannot be made,
// it takes a block unlocked (as before blocks, a collision stays possible).
func claimBlock() error {
	n := (portHigh - portLow) / portBlock
	for _, i := range rand.Perm(n) {
		low := portLow + i*portBlock
		if slices.Contains(owned, low) {
			continue
		}
		path := filepath.Join(os.TempDir(), "mqd-testcluster-ports-"+strconv.Itoa(low)+".lock")
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			owned = append(owned, low)
			return nil
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		locks = append(locks, f)
		owned = append(owned, low)
		return nil
	}
	return fmt.Errorf("every block of ports in [%d,%d) is held by another process", portLow, portHigh)
}

// FreeAddr is freeAddr for tests that start processes of their own (the
// scripts' and deploy files' command lines).
func FreeAddr() (string, error) { return freeAddr() }
