package fsm

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"
)

// OpenFSM opens the state machine at path: as it was after a clean close,
// at its last checkpoint after any other stop (checkpoint.go), or, when
// neither can be trusted or the file fails its checks (damage.go), set
// aside and started empty, so that raft restores the latest snapshot and
// replays the log into it.
func OpenFSM(path string, logger *slog.Logger) (*FSM, error) {
	return OpenFSMBacked(path, logger, math.MaxUint64)
}

// OpenFSMBacked is OpenFSM for a node whose raft log and snapshots reach
// the index backed: a live tree applied past both it and its checkpoint
// is copied aside before the rollback (evidence.go).
func OpenFSMBacked(path string, logger *slog.Logger, backed uint64) (*FSM, error) {
	f := &FSM{path: path, logger: logger}
	st, stErr := readFSMState(path)
	plan := planOpen(path, st, stErr)
	if stErr != nil {
		st = nil
	}
	sf, err := openStateFile(path, st)
	if err != nil {
		return nil, err
	}
	f.state = sf
	start := time.Now()
	if plan.restore != nil { // before the rollback
		if err := f.keepLiveEvidence(plan.restore.index, backed); err != nil {
			sf.close()
			return nil, err
		}
	}
	if plan.use {
		if err := f.openPlanned(&plan); err != nil {
			sf.close()
			return nil, err
		}
	}
	if !plan.use {
		if err := f.startEmpty(plan); err != nil {
			sf.close()
			return nil, err
		}
	}
	if err := f.loadFormat(); err != nil {
		f.db.Close()
		sf.close()
		return nil, err
	}
	index, term := f.storedApplied()
	if plan.restore != nil && index != plan.restore.index {
		// The tree at the checkpoint's transaction holds another index:
		// not the tree that was synced.
		f.db.Close()
		plan = openPlan{reason: "checkpoint_mismatch", why: fmt.Sprintf(
			"its checkpoint says applied index %d, the tree there holds %d", plan.restore.index, index)}
		if err := f.startEmpty(plan); err != nil {
			sf.close()
			return nil, err
		}
		index, term = f.storedApplied()
	}
	f.applied.Store(index)
	f.opened = index
	f.openedClean = plan.use && plan.restore == nil && index > 0
	if err := f.takeCheckpoint(false); err != nil {
		f.db.Close()
		sf.close()
		return nil, err
	}
	if plan.use {
		f.logOpened(plan, index, term, time.Since(start))
	}
	f.startCheckpoints()
	return f, nil
}

// openPlan is what OpenFSM does with the file it finds.
type openPlan struct {
	use     bool        // open the file; otherwise set it aside and start empty
	restore *checkpoint // first write this checkpoint's meta page back
	want    []byte      // the meta page the file must be at (a clean close's)
	valid   *checkpoint // the checkpoint that holds while it is opened
	reason  string      // !use: the recovery's metric label ("" for a new node)
	why     string
	checked bool // the page tree check ran (not cut short by size)
}

// planOpen decides from the state file how to open the fsm.db at path.
func planOpen(path string, st *fsmState, stErr error) openPlan {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		if st != nil && st.ckpt != nil {
			return openPlan{reason: "missing", why: "fsm.db is missing although fsm.db.state records it"}
		}
		return openPlan{why: "no fsm.db yet"}
	}
	switch {
	case stErr != nil:
		return openPlan{reason: "state_unreadable", why: stErr.Error()}
	case st == nil:
		return openPlan{reason: "no_state", why: "no record of how it was closed (no fsm.db.state)"}
	case st.legacy == "clean":
		return openPlan{use: true, why: "closed cleanly (recorded by an older mqd)"}
	case st.legacy != "":
		return openPlan{reason: "unclean_no_checkpoint", why: "open when mqd stopped, recorded by an older mqd without checkpoints"}
	case st.clean && st.ckpt != nil:
		return openPlan{use: true, want: st.ckpt.meta[:], valid: st.ckpt, why: "closed cleanly"}
	case st.ckpt != nil:
		return openPlan{use: true, restore: st.ckpt, valid: st.ckpt,
			why: "not closed cleanly (process killed, power loss or kernel crash): opened at its last checkpoint"}
	default:
		return openPlan{reason: "unclean_no_checkpoint", why: "not closed cleanly, and no checkpoint recorded"}
	}
}

// openPlanned opens the file as plan says. A damaged file turns plan into
// one that sets it aside; other errors are returned.
func (f *FSM) openPlanned(plan *openPlan) error {
	if plan.restore != nil {
		if err := putCheckpointMeta(f.path, plan.restore); err != nil {
			return plan.damaged(err)
		}
	}
	if _, err := preCheck(f.path, plan.want); err != nil {
		return plan.damaged(err)
	}
	// Durably "open", with the checkpoint that holds for this file, before
	// bbolt writes to it.
	if err := f.state.write(false, plan.valid); err != nil {
		return err
	}
	db, checked, err := openChecked(f.path)
	if err != nil {
		return plan.damaged(err)
	}
	f.db, plan.checked = db, checked
	return nil
}

// damaged turns plan into one that sets the file aside, for a *damage;
// it returns any other error.
func (p *openPlan) damaged(err error) error {
	var d *damage
	if !errors.As(err, &d) {
		return err
	}
	*p = openPlan{reason: d.reason, why: "damaged (" + d.reason + "): " + d.detail}
	return nil
}

// startEmpty sets the file aside (if any), logs why and starts empty.
func (f *FSM) startEmpty(plan openPlan) error {
	aside, err := setAside(f.path)
	if err != nil {
		return err
	}
	if err := f.state.write(false, nil); err != nil {
		return err
	}
	if err := f.openFresh(); err != nil {
		return err
	}
	if plan.reason == "" {
		f.logger.Info("state machine starts empty", "why", plan.why)
		return nil
	}
	f.logger.Error("fsm.db not used: "+plan.why+"; it was set aside and the state starts empty, rebuilt from the latest snapshot "+
		"and the raft log (or the leader's snapshot)", "reason", plan.reason, "set_aside_as", aside)
	f.RecordRecovery(plan.reason)
	return nil
}

// openFresh opens a new, empty fsm.db at f.path.
func (f *FSM) openFresh() error {
	db, err := openDB(f.path)
	if err != nil {
		return err
	}
	f.db = db
	f.applied.Store(0)
	f.opened = 0
	return nil
}

func (f *FSM) logOpened(plan openPlan, index, term uint64, took time.Duration) {
	tree := "checked"
	if !plan.checked {
		tree = fmt.Sprintf("not checked: the file is above %d MiB (meta pages and length checked)", fsmCheckMaxBytes>>20)
	}
	if plan.restore != nil {
		f.logger.Warn("state machine opened at its last checkpoint: fsm.db was "+plan.why[:strings.Index(plan.why, ":")]+
			"; raft replays the log after it", "applied_index", index, "applied_term", term, "tree_check", tree,
			"took", took.Round(time.Millisecond))
		f.RecordRecovery("unclean_stop")
		return
	}
	// Opening takes about a second per GiB of fsm.db when bbolt walks every
	// page to rebuild a free list it did not write (see boltOpts).
	f.logger.Info("state machine opened as it was", "applied_index", index, "applied_term", term, "why", plan.why,
		"tree_check", tree, "took", took.Round(time.Millisecond))
}
