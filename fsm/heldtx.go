package fsm

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Long read transactions and the file replaced under them.
//
// A raft snapshot (Snapshot, then Persist on raft's snapshot goroutine) and
// a backup hold a bbolt read transaction outside f.mu, and bbolt's Close
// waits for every read transaction to end. Restore and compaction replace
// fsm.db, so they close the old file; if that waited, it could wait for
// ever: raft's snapshot goroutine, between FSM.Snapshot and Persist, asks
// raft's main goroutine for the configuration, while the main goroutine
// waits for the Restore of a snapshot a leader sent (InstallSnapshot). Three
// goroutines then wait on each other, and the follower never catches up
// (seen as TestCatchUpBoundedMemory's hang under load).
//
// So a file with such a transaction open is closed by the last one to
// end, not by the goroutine that replaces it. Until then the old file
// stays open, read-only in effect (nothing writes to it once f.db is the
// new one); its inode outlives the rename over its name, so the
// transaction reads the state it began on.
type heldTxs struct {
	mu      sync.Mutex
	open    map[*bolt.DB]int  // read transactions held outside f.mu, per file
	retired map[*bolt.DB]bool // replaced while some were open: closed by the last
}

// hold counts a long read transaction begun on db; the returned release
// must be called once, after the transaction's Rollback.
func (h *heldTxs) hold(db *bolt.DB) (release func()) {
	h.mu.Lock()
	if h.open == nil {
		h.open, h.retired = map[*bolt.DB]int{}, map[*bolt.DB]bool{}
	}
	h.open[db]++
	h.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { h.release(db) }) }
}

func (h *heldTxs) release(db *bolt.DB) {
	h.mu.Lock()
	h.open[db]--
	last := h.open[db] == 0
	closeIt := last && h.retired[db]
	if last {
		delete(h.open, db)
		delete(h.retired, db)
	}
	h.mu.Unlock()
	if closeIt {
		_ = db.Close() // read-only since it was replaced: nothing to lose
	}
}

// retire closes db, which is being replaced, now if no long read
// transaction is open on it (returning Close's error), or else when the
// last one is released. The caller holds f.mu, so no other transaction
// begins on it meanwhile.
func (h *heldTxs) retire(db *bolt.DB) error {
	h.mu.Lock()
	if h.open[db] > 0 {
		h.retired[db] = true
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	return db.Close()
}
