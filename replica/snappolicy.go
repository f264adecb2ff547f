package replica

import "math"

// When to snapshot. A snapshot copies the whole FSM — every retained
// message — so hashicorp/raft's own trigger, a count of log entries, makes
// its cost grow with the backlog (a node holding 50 GB would copy 50 GB
// every --snapshot-threshold entries), and says nothing of their size (a
// group commit of batch publishes is one entry of up to 4 MiB, so 8192 of
// them are 32 GiB of log and no snapshot). mqd takes snapshots itself,
// when the raft log applied since the last one holds at least
// 1/snapshotRatio of the state's size (or of snapshotRatioFloor, for a
// smaller state), or, while the state is under snapshotRatioFloor, after
// --snapshot-threshold entries. So:
//   - the bytes snapshots write stay within snapshotRatio times the log
//     bytes, or snapshotRatioFloor per --snapshot-threshold entries for a
//     small state (512 bytes per entry at the default 8192);
//   - the log a restart reads back and the disk keeps stays within half
//     the state (or 2 MiB, or the threshold's entries, if larger).
//
// BenchmarkSnapshotBytes and BenchmarkRestart measure both.
const (
	snapshotRatioFloor = 4 << 20
	snapshotRatio      = 2
	// RaftSnapshotOff is the threshold given to raft: never by itself.
	RaftSnapshotOff = math.MaxUint64
)

// SnapshotState is what the snapshot policy decides from.
type SnapshotState struct {
	Applied, LastSnapshot uint64 // the applied index, the latest snapshot's
	StateSize             int64  // the state file's size
	SinceBytes            uint64 // log bytes applied since the latest snapshot
	Threshold             uint64 // --snapshot-threshold
	// Reclaim reports whether a snapshot should give space back now (a
	// low disk and a sparse state); asked only when one could be taken.
	Reclaim func() bool
}

// SnapshotDue applies the policy above, and says why.
func SnapshotDue(s SnapshotState) (bool, string) {
	applied, last := s.Applied, s.LastSnapshot
	if applied <= last {
		return false, ""
	}
	if s.Reclaim != nil && s.Reclaim() {
		return true, "reclaim" // the snapshot compacts the state first (fsm/compact.go)
	}
	size, since := s.StateSize, s.SinceBytes
	if since >= uint64(max(size, snapshotRatioFloor))/snapshotRatio {
		return true, "log bytes"
	}
	if size < snapshotRatioFloor && applied-last >= s.Threshold {
		return true, "entries"
	}
	return false, ""
}

// TrailingBytesFloor is the least raft log, in bytes, a snapshot leaves
// behind it (snapshots.go, boundTrailingLogs).
const TrailingBytesFloor = 64 << 20

// TrailingEntriesFloor is the fewest entries a snapshot leaves behind it,
// however large they are.
const TrailingEntriesFloor = 16

// TrailingKeep is how many entries to keep behind a snapshot: at most
// trailing, and no more than fit in a quarter of the state's size (at
// least TrailingBytesFloor) at the mean size of the sinceEntries entries
// (sinceBytes) applied since the last snapshot; never fewer than
// TrailingEntriesFloor (or trailing, if lower).
func TrailingKeep(trailing, stateSize, sinceBytes, sinceEntries uint64) uint64 {
	if sinceEntries == 0 || sinceBytes == 0 {
		return trailing
	}
	mean := max(sinceBytes/sinceEntries, 1)
	fit := max(stateSize/4, TrailingBytesFloor) / mean
	return min(trailing, max(fit, TrailingEntriesFloor))
}
