package api

import (
	"fmt"

	"github.com/mqd/mqd/raftfsm"
)

// alarms are the answering node's resource warnings for people, in
// GET /v1/cluster's "alarms" (the console shows them): free disk under
// --min-free-disk or within twice of it, open files over 80 % of the
// limit, a clock judged bad or near --max-clock-offset.
func alarms(r raftfsm.Resources) []string {
	out := []string{}
	switch {
	case r.DiskLow:
		out = append(out, fmt.Sprintf("disk: %d bytes free, under --min-free-disk (%d bytes): writes that add data answer 507",
			r.DiskFreeBytes, r.DiskMinFreeBytes))
	case r.DiskMinFreeBytes > 0 && r.DiskFreeBytes < 2*r.DiskMinFreeBytes:
		out = append(out, fmt.Sprintf("disk: %d bytes free, less than twice --min-free-disk (%d bytes)", r.DiskFreeBytes, r.DiskMinFreeBytes))
	}
	if r.OpenFilesLimit > 0 && r.OpenFiles >= 0 && uint64(r.OpenFiles)*10 > r.OpenFilesLimit*8 {
		out = append(out, fmt.Sprintf("open files: %d of the limit %d", r.OpenFiles, r.OpenFilesLimit))
	}
	switch {
	case r.ClockBad:
		out = append(out, "clock: "+r.ClockReason)
	case r.MaxClockOffsetMs > 0 && 2*abs(r.ClockOffsetMs) > r.MaxClockOffsetMs:
		out = append(out, fmt.Sprintf("clock: %d ms off the cluster's, over half of --max-clock-offset (%d ms)", r.ClockOffsetMs, r.MaxClockOffsetMs))
	}
	return out
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
