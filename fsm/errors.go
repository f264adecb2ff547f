package fsm

import "github.com/mqd/mqd/internal/refusal"

// Refusals (package refusal) of the state machine: the FSM answers them,
// api maps them.
var (
	ErrSeqGap    = refusal.New(409, "sequence_gap", "producer sequence gap")
	ErrSeqTooOld = refusal.New(409, "sequence_too_old", "producer sequence older than the kept history")
	// ErrSeqOverlap: a batch starts at a stored sequence but runs past the
	// last stored one (a partial repeat).
	ErrSeqOverlap = refusal.New(409, "sequence_overlap", "producer sequence overlap")
)
