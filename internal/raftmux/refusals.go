package raftmux

import (
	"log/slog"
	"sync"
	"time"
)

// refusalWindow is how long a peer's refused connections stay quiet after
// one is logged: a peer retries every few milliseconds (raft's pool, its
// heartbeats), and one line a minute says as much as a thousand.
const refusalWindow = time.Minute

// refusals logs refused connections once per peer (host) and window,
// with how many were refused in between.
type refusals struct {
	mu   sync.Mutex
	seen map[string]*refusal
	now  func() time.Time // nil: time.Now
}

type refusal struct {
	at         time.Time
	suppressed int
}

func (r *refusals) log(l *slog.Logger, peer string, err error) {
	if ok, n := r.allow(peer); ok {
		l.Warn(err.Error(), "peer", peer, "suppressed", n)
	}
}

// allow reports whether a refusal from peer may be logged now, and how
// many were suppressed since the last one was.
func (r *refusals) allow(peer string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.now != nil {
		now = r.now()
	}
	p := r.seen[peer]
	if p != nil && now.Sub(p.at) < refusalWindow {
		p.suppressed++
		return false, 0
	}
	if len(r.seen) > 1024 { // bounded however many peers knock
		clear(r.seen)
	}
	n := 0
	if p != nil {
		n = p.suppressed
	}
	r.seen[peer] = &refusal{at: now}
	return true, n
}
