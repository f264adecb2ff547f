package chaos

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strings"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// Final is the broker's state after the run has healed and drained.
type Final struct {
	Stats tc.TopicStats
	DLQ   map[string][]deadLetter // group → every dead letter
}

// Check compares the history with the final state. The invariants:
//
//   - conservation: every publish that got a 2xx is, in every group, completed
//     exactly once: acked by a consumer ("ok", or an ack without a definite
//     answer when nothing else completed it) or dead-lettered. None completed:
//     lost. More than once (two "ok" acks, an ack and a dead letter, two dead
//     letters): duplicated completion;
//   - every stored message (every offset below next_offset of every
//     partition) reached every group (delivered, or in its DLQ);
//   - nothing appears that was never published: every delivered or
//     dead-lettered message carries a key a producer tried, with its payload;
//   - one key, one message: a key is only ever seen at one position, a
//     position only ever holds one key, and a 2xx names that position;
//   - order: the keys a producer published one after the other (to one
//     partition, by its partition key) have increasing offsets;
//   - no redelivery after a successful ack; no "invalid" for an issued receipt;
//     a dead letter rejected without retry was rejected by a consumer;
//   - the broker's counters agree: per group, acked + dlq + duplicates_skipped
//     = stored messages, dlq = the letters listed, and acked = the acks that
//     answered ok plus those completed by an unanswered ack;
//   - no status outside 2xx/503 for a well-formed request (recorded while
//     running), and publish dedup answers repeats with the first placement.
func Check(h *History, fin Final, groups []string) *Figures {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := &Figures{Ops: h.ops, Violations: map[string][]string{}, Anomalies: h.anomalies}
	for k, v := range h.violations {
		f.Violations[k] = append([]string(nil), v...)
	}
	bad := func(kind, format string, args ...any) {
		f.Violations[kind] = append(f.Violations[kind], fmt.Sprintf(format, args...))
	}

	// Positions: which key is stored where, from every source.
	keyAt := map[pos]string{}
	posOf := map[string]pos{}
	see := func(key string, at pos, source string) {
		if k, ok := keyAt[at]; ok && k != key {
			bad("two-keys-one-position", "%v holds %s and %s (%s)", at, k, key, source)
		}
		keyAt[at] = key
		if p, ok := posOf[key]; ok && p != at {
			bad("one-key-two-messages", "key %s stored at %v and %v (%s)", key, p, at, source)
			return
		}
		posOf[key] = at
	}
	for _, r := range h.pubs {
		f.Keys++
		if r.poison {
			f.Poison++
		}
		if r.acked {
			f.Acknowledged++
			see(r.key, r.pos, "publish answer")
		} else {
			f.Indeterminate++
		}
	}
	for _, g := range groups {
		for key, kg := range h.groups[g] {
			for at := range kg.positions {
				see(key, at, "delivery to "+g)
			}
		}
	}

	// Dead letters: known keys and payloads, plausible reasons.
	dlqKeys := map[string]map[string]int{}
	for _, g := range groups {
		dlqKeys[g] = map[string]int{}
		for _, d := range fin.DLQ[g] {
			at := pos{d.Partition, d.Offset}
			r, known := h.pubs[d.IdempotencyKey]
			v, err := base64.StdEncoding.DecodeString(d.ValueB64)
			if err != nil {
				v, err = base64.RawStdEncoding.DecodeString(d.ValueB64)
			}
			switch {
			case !known:
				bad("phantom", "group %s dead letter %d at %v: key %q was never published", g, d.ID, at, d.IdempotencyKey)
				continue
			case err != nil || string(v) != r.payload:
				bad("phantom", "group %s dead letter %d at %v key %s: payload %q, published %q", g, d.ID, at, d.IdempotencyKey, truncate(string(v), 60), truncate(r.payload, 60))
			}
			see(d.IdempotencyKey, at, "dlq of "+g)
			dlqKeys[g][d.IdempotencyKey]++
			if n := len(d.History); n > 0 && d.History[n-1].Kind == "rejected" {
				if kg := h.groups[g][d.IdempotencyKey]; kg == nil || kg.rejects == 0 {
					bad("spurious-dead-letter", "group %s dead letter %d key %s: last failure %q (%q) but no consumer rejected it",
						g, d.ID, d.IdempotencyKey, d.History[n-1].Kind, d.History[n-1].Reason)
				}
			}
			if len(d.History) == 0 {
				bad("dead-letter-history", "group %s dead letter %d key %s has no history", g, d.ID, d.IdempotencyKey)
			}
		}
	}
	for _, r := range h.pubs {
		if !r.acked {
			if _, ok := posOf[r.key]; ok {
				f.IndeterminateFound++
			}
		}
	}

	// Conservation per group, over every key that is acknowledged or stored.
	var stored int64
	for _, p := range fin.Stats.Partitions {
		stored += p.NextOffset
	}
	f.Stored = stored
	for _, g := range groups {
		oks, ambiguousDone := 0, 0
		consider := map[string]bool{}
		for k, r := range h.pubs {
			if r.acked {
				consider[k] = true
			}
		}
		for k := range posOf {
			consider[k] = true
		}
		for key := range consider {
			r := h.pubs[key]
			kg := h.groups[g][key]
			var kgv keyGroup
			if kg != nil {
				kgv = *kg
			}
			f.Deliveries += kgv.deliveries
			dl := dlqKeys[g][key]
			done := kgv.oks + dl
			oks += kgv.oks
			if r.poison && kgv.oks > 0 {
				bad("poison-acked", "group %s key %s: poison acked (harness bug)", g, key)
			}
			switch {
			case done == 0 && kgv.ambiguous > 0:
				ambiguousDone++
				f.CompletedAmbiguous++
			case done == 0:
				f.Lost++
				bad("lost", "group %s key %s (publish acked %v at %v, %d attempts): never completed: %d deliveries at %v, %d stale acks, %d retry nacks, %d rejects, %d crashes, %d replays asked, not in the DLQ",
					g, key, r.acked, r.pos, r.attempts, kgv.deliveries, positions(kgv.positions), kgv.staleAcks, kgv.retryNacks, kgv.rejects, kgv.crashes, kgv.replays)
			case done > 1:
				f.Duplicated++
				bad("duplicated-completion", "group %s key %s at %v: %d ok acks, %d dead letters (%d deliveries, %d replays)",
					g, key, posOf[key], kgv.oks, dl, kgv.deliveries, kgv.replays)
			}
			f.CompletedByAck += kgv.oks
			f.DeadLettered += dl
		}
		// Every stored offset reached the group.
		for _, p := range fin.Stats.Partitions {
			missing := 0
			var first pos
			for o := int64(0); o < p.NextOffset; o++ {
				key, ok := keyAt[pos{p.Partition, o}]
				seen := ok && (dlqKeys[g][key] > 0 || (h.groups[g][key] != nil && h.groups[g][key].positions[pos{p.Partition, o}] > 0))
				if !seen {
					if missing == 0 {
						first = pos{p.Partition, o}
					}
					missing++
				}
			}
			if missing > 0 {
				bad("stored-not-delivered", "group %s partition %d: %d stored offsets never delivered nor dead-lettered (first %v, key %q)",
					g, p.Partition, missing, first, keyAt[first])
			}
		}
		// The broker's own counters.
		gs, ok := fin.Stats.Groups[g]
		if !ok {
			bad("broker-counters", "group %s missing from the topic stats", g)
			continue
		}
		if gs.Acked+gs.DLQ+gs.DuplicatesSkipped != stored {
			bad("broker-counters", "group %s: acked %d + dlq %d + duplicates_skipped %d != stored %d",
				g, gs.Acked, gs.DLQ, gs.DuplicatesSkipped, stored)
		}
		if gs.DLQ != int64(len(fin.DLQ[g])) {
			bad("broker-counters", "group %s: stats dlq %d, listed %d", g, gs.DLQ, len(fin.DLQ[g]))
		}
		if gs.Acked != int64(oks+ambiguousDone) {
			bad("broker-counters", "group %s: broker counts %d acks; consumers saw %d ok and %d completed by unanswered acks",
				g, gs.Acked, oks, ambiguousDone)
		}
		if gs.Backlog+gs.InFlight+gs.Delayed+gs.ReplayPending != 0 {
			bad("not-drained", "group %s: backlog %d in_flight %d delayed %d replay_pending %d", g, gs.Backlog, gs.InFlight, gs.Delayed, gs.ReplayPending)
		}
	}

	// Order: per producer, acknowledged keys in publish order.
	for p, keys := range h.byProducer {
		var prev *pubRec
		for _, k := range keys {
			r := h.pubs[k]
			if !r.acked {
				continue
			}
			if prev != nil && (r.pos.p != prev.pos.p || r.pos.o <= prev.pos.o) {
				bad("order", "producer %d: %s at %v after %s at %v", p, r.key, r.pos, prev.key, prev.pos)
			}
			prev = r
		}
	}
	return f
}

func positions(m map[pos]int) string {
	var parts []string
	for p, n := range m {
		parts = append(parts, fmt.Sprintf("%v×%d", p, n))
	}
	sort.Strings(parts)
	return "[" + strings.Join(parts, " ") + "]"
}
