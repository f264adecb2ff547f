package main

import (
	"fmt"
	"log/slog"
	"syscall"
)

// fdReserve is the share of the file-descriptor limit kept for what is not
// a client connection: the raft log's segments, bbolt, snapshots, raft
// peers and connections to the leader.
const fdReserve = 10 // percent, and at least 256 descriptors

// raiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit and
// answers the limit in force. Go's runtime does the same at start since
// Go 1.19; doing it here keeps it true whatever the toolchain, and the
// answer sizes --max-connections.
func raiseFileLimit(logger *slog.Logger) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			logger.Warn("cannot raise the open-file limit", "soft", rl.Cur, "hard", rl.Max, "err", err)
			return rl.Cur, nil
		}
		rl = want
	}
	return rl.Cur, nil
}

// connCap is the most client connections the descriptor limit allows.
func connCap(nofile uint64) int {
	reserve := max(nofile*fdReserve/100, 256)
	if nofile <= reserve+64 {
		return 64
	}
	return int(min(nofile-reserve, 1<<30))
}
