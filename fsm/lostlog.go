package fsm

// LostEvidence is the highest applied index (and its term) this node's
// state is known to have reached before this start: the index its log
// must back. That is the state as opened, or, when OpenFSM rolled the
// file back to its checkpoint, what its live tree had applied before
// (evidence.go): otherwise a log that lost its tail goes unnoticed.
func (f *FSM) LostEvidence() (index, term uint64) {
	index, term = f.AppliedIndexTerm()
	if f.live[0] > index {
		return f.live[0], f.live[1]
	}
	return index, term
}

// AppliedIndexTerm is the applied index and term the state records.
func (f *FSM) AppliedIndexTerm() (index, term uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.storedApplied()
}
