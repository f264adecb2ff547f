package testcluster

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Ports come from below the kernel's ephemeral range (32768+ on Linux), so an
// outgoing connection cannot take a node's port between picking it and the
// node binding it, nor while the node is down for a restart.
const (
	portLow  = 20000
	portHigh = 32000
)

var (
	portsMu sync.Mutex
	used    = map[int]bool{}
)

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago and has
// not been handed out before in this process.
func freeAddr() (string, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		p := portLow + rand.IntN(portHigh-portLow)
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
	return "", fmt.Errorf("no free port in [%d,%d)", portLow, portHigh)
}

// FreeAddr is freeAddr for tests that start processes of their own (the
// scripts' and deploy files' command lines).
func FreeAddr() (string, error) { return freeAddr() }
