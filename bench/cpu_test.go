package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTick is the unit of /proc/PID/stat's utime and stime (USER_HZ, 100
// on Linux).
const clockTick = 10 * time.Millisecond

// procCPU is the user + system time process pid has used so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after its closing parenthesis (field 3, state, comes first).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64) // field 14
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime/stime", pid)
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// cpuSample is the CPU time the cluster's node processes and its leader
// have used so far.
type cpuSample struct {
	cluster, leader time.Duration
	ok              bool
}

func (s *system) cpu() cpuSample {
	out := cpuSample{ok: true}
	for _, n := range s.c.Nodes() {
		d, err := procCPU(n.PID())
		if err != nil {
			return cpuSample{}
		}
		out.cluster += d
		if n == s.leader {
			out.leader = d
		}
	}
	return out
}

// cpuMetrics are the CPU microseconds per message of the whole cluster and
// of its leader between two samples (none if either could not be read).
func cpuMetrics(a, b cpuSample, msgs int) []metric {
	if !a.ok || !b.ok || msgs == 0 {
		return nil
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(msgs) }
	return []metric{{per(b.cluster - a.cluster), "cpu_us/msg"}, {per(b.leader - a.leader), "leader_cpu_us/msg"}}
}
