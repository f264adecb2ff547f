package fsm

import (
	"log/slog"
	"os"
)

// exit ends the process; a variable so that a test can see the call.
var exit = osExit

var osExit = os.Exit

// stopOnStorageError ends the process when the state file cannot take a
// committed batch (a full disk, an I/O error). Skipping the batch would let
// replicas diverge and retrying in place would block raft; the entries are
// in the fsynced raft log, so a restart once the disk has room applies
// them again and nothing acknowledged is lost.
func stopOnStorageError(logger *slog.Logger, index uint64, err error) {
	logger.Error("stopping: the state file cannot be written; free space or fix the disk, then restart (committed entries are in the raft log and are applied again)",
		"index", index, "err", err)
	exit(1)
}
