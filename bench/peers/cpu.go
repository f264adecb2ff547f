package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// CPU per message. brokerCPU, while a system runs, reports the CPU time
// (user + system, /proc/PID/stat) its three server processes have used so
// far: the mqd nodes, or the nats-server nodes. The load generator (this
// process) is not counted for either.
var (
	cpuMu     sync.Mutex
	brokerCPU func() (time.Duration, bool)
)

func setBrokerCPU(f func() (time.Duration, bool)) {
	cpuMu.Lock()
	brokerCPU = f
	cpuMu.Unlock()
}

func readBrokerCPU() (time.Duration, bool) {
	cpuMu.Lock()
	f := brokerCPU
	cpuMu.Unlock()
	if f == nil {
		return 0, false
	}
	return f()
}

// clockTick is the unit of /proc/PID/stat's utime and stime (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is the user + system time of process pid (all its threads).
func procCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (field 3, state, comes first).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64) // field 14
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: utime/stime", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// pidsCPU sums procCPU over pids; false if any cannot be read.
func pidsCPU(pids []int) (time.Duration, bool) {
	var sum time.Duration
	for _, p := range pids {
		d, err := procCPU(strconv.Itoa(p))
		if err != nil {
			return 0, false
		}
		sum += d
	}
	return sum, true
}

// cpuBetween samples the brokers' CPU at start and at end (both in the
// future or now) and sends the difference, or -1 if it could not.
func cpuBetween(start, end time.Time) <-chan time.Duration {
	ch := make(chan time.Duration, 1)
	go func() {
		time.Sleep(time.Until(start))
		a, ok1 := readBrokerCPU()
		time.Sleep(time.Until(end))
		b, ok2 := readBrokerCPU()
		if !ok1 || !ok2 {
			ch <- -1
			return
		}
		ch <- b - a
	}()
	return ch
}
