// Package fsm is mqd's replicated state machine: the FSM that applies each
// Raft batch of commands (package command) in one bbolt transaction
// (apply.go, publish.go, process.go), the state format rules (format.go),
// the typed reads the HTTP layer answers from (read.go, lease.go,
// trace.go), snapshots and restores, and everything that works on fsm.db
// itself: open and its trust decision (fsmopen.go, fsmstate.go),
// checkpoints (checkpoint.go), damage checks (damage.go), the lost-entries
// evidence (evidence.go, lostlog.go), compaction (compact.go) and backups
// (backup.go).
//
// It knows raft only as hashicorp/raft's FSM interface and log entries;
// the node that runs raft sets its Hooks and reads it. It does not own the
// data layouts (packages log, group, dlq, dedup): apply is one switch over
// them.
package fsm
