package group

import (
	"github.com/mqd/mqd/dlq"
	mlog "github.com/mqd/mqd/log"
)

// Failure describes a failed delivery: a nack or an expired lease. Rand is
// a random number the leader drew for the jitter; DelayMs, when >= 0,
// overrides the computed backoff (a nack's delay_ms).
type Failure struct {
	dlq.Failure
	Retryable bool
	DelayMs   int64
	Rand      uint32
}

// policy is a message's effective retry policy.
type policy struct {
	maxRetry, base, max, jitter int64
}

func (g *Group) policyOf(m *mlog.Message) policy {
	c := g.log.Cfg
	pol := policy{maxRetry: c.MaxRetry, base: c.BackoffBaseMs, max: c.BackoffMaxMs, jitter: c.BackoffJitterMs}
	if m.MaxRetry >= 0 {
		pol.maxRetry = m.MaxRetry
	}
	if m.BackoffBaseMs >= 0 {
		pol.base = m.BackoffBaseMs
	}
	if m.BackoffJitterMs >= 0 {
		pol.jitter = m.BackoffJitterMs
	}
	return pol
}

// Backoff is the delay before retry number retry (1 for the first):
// min(max, base * 2^(retry-1)) plus jitter scaled from rand over [0, jitter].
func Backoff(base, max, jitter int64, retry uint32, rand uint32) int64 {
	d := base
	for i := uint32(1); i < retry && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	if jitter > 0 {
		d += int64((uint64(rand) * uint64(jitter+1)) >> 32)
	}
	return d
}

// fail records a failed delivery of the leased message at (p, off): it
// goes back to the ready index after its backoff, or, when it is not
// retryable or out of retries, to the dead-letter store.
func (g *Group) fail(p uint32, off uint64, rec record, f Failure) error {
	part, err := g.log.Partition(p)
	if err != nil {
		return err
	}
	m, err := part.Get(off)
	if err != nil {
		return err
	}
	if m == nil { // trimmed: nothing left to retry
		return g.remove(p, off, rec)
	}
	g.count(func(t *Tally) {
		if f.Kind == dlq.KindLeaseExpired {
			t.LeasesExpired++
		} else {
			t.Nacked++
		}
	})
	pol := g.policyOf(m)
	nr := record{RetryCount: rec.RetryCount + 1, Key: rec.Key, Reason: f.Reason,
		History: dlq.AppendHistory(rec.History, f.Failure)}
	if !f.Retryable || int64(nr.RetryCount) > pol.maxRetry {
		if err := g.bury(p, off, rec, nr, m, f.At); err != nil {
			return err
		}
	} else {
		delay := f.DelayMs
		if delay < 0 {
			delay = Backoff(pol.base, pol.max, pol.jitter, nr.RetryCount, f.Rand)
		}
		nr.State, nr.Until = stateReady, f.At+delay
		if err := g.replace(p, off, rec, nr); err != nil {
			return err
		}
	}
	return g.releaseHeld(rec.Key, f.At, false)
}

// bury moves a message to the dead-letter store.
func (g *Group) bury(p uint32, off uint64, old, nr record, m *mlog.Message, at int64) error {
	store, err := dlq.Open(g.b, true)
	if err != nil {
		return err
	}
	id, err := store.Add(&dlq.Letter{Partition: p, Offset: off, Msg: m, RejectReason: nr.Reason,
		RetryCount: nr.RetryCount, DeadAt: at, History: nr.History})
	if err != nil {
		return err
	}
	nr.State, nr.Delivery, nr.Until = stateDead, id, at
	g.count(func(t *Tally) { t.DeadLettered++ })
	nr.History = nil // the dead letter has it
	return g.replace(p, off, old, nr)
}

// Nack fails the leased messages of receipts, one Failure each.
func (g *Group) Nack(now int64, idx uint64, receipts []Receipt, fs []Failure) ([]string, error) {
	return g.eachLease(now, idx, receipts, func(i int, r Receipt, rec record) error {
		return g.fail(r.Partition, r.Offset, rec, fs[i])
	})
}

// ExpireLease fails an expired lease (kind lease_expired). A lease that was
// acked, extended or re-leased since is left alone.
func (g *Group) ExpireLease(r Receipt, f Failure) error {
	rec, ok, err := g.getRecord(r.Partition, r.Offset)
	if err != nil || !ok || rec.State != stateLeased || rec.Delivery != r.Delivery || rec.Until > f.At {
		return err
	}
	f.Kind, f.Retryable, f.DelayMs = dlq.KindLeaseExpired, true, -1
	if f.Reason == "" {
		f.Reason = "lease expired"
	}
	if err := g.fail(r.Partition, r.Offset, rec, f); err != nil {
		return err
	}
	return g.Save()
}

// DeadLetters opens the group's dead-letter store.
func (g *Group) DeadLetters() (*dlq.Store, error) { return dlq.Open(g.b, g.tx.Writable()) }

// DeleteDeadLetter discards a dead letter: the message is done for the group.
func (g *Group) DeleteDeadLetter(id uint64) error {
	store, err := g.DeadLetters()
	if err != nil {
		return err
	}
	l, err := store.Delete(id)
	if err != nil {
		return err
	}
	if rec, ok, err := g.getRecord(l.Partition, l.Offset); err != nil {
		return err
	} else if ok && rec.State == stateDead && rec.Delivery == id {
		if err := g.remove(l.Partition, l.Offset, rec); err != nil {
			return err
		}
	}
	return g.Save()
}

// ReplayStep puts up to max queued dead letters back into delivery, due
// now, with retry_count reset. A letter whose message retention has since
// removed is counted as skipped.
func (g *Group) ReplayStep(now int64, max int) (int, error) {
	store, err := g.DeadLetters()
	if err != nil {
		return 0, err
	}
	letters, err := store.NextReplay(max)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range letters {
		rec, ok, err := g.getRecord(l.Partition, l.Offset)
		if err != nil {
			return n, err
		}
		if !ok || rec.State != stateDead || rec.Delivery != l.ID {
			if err := store.Replayed(false); err != nil {
				return n, err
			}
			continue
		}
		if err := g.replace(l.Partition, l.Offset, rec, record{State: stateReady, Until: now, Key: rec.Key}); err != nil {
			return n, err
		}
		if err := store.Replayed(true); err != nil {
			return n, err
		}
		g.count(func(t *Tally) { t.Replayed++ })
		n++
	}
	return n, g.Save()
}
