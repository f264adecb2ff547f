package chaos

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// pos is a stored message's place: partition and offset.
type pos struct {
	p int
	o int64
}

func (p pos) String() string { return fmt.Sprintf("%d@%d", p.p, p.o) }

// pubRec is everything the producers did for one idempotency key.
type pubRec struct {
	key, payload string
	producer     int
	seq          int
	poison       bool
	attempts     int
	acked        bool // some attempt got a 2xx
	pos          pos  // the 2xx's partition and offset
	givenUp      bool // the producer stopped retrying without a 2xx
}

// keyGroup is what one group's consumers saw and did for one key.
type keyGroup struct {
	positions  map[pos]int // deliveries per stored position
	deliveries int
	oks        int       // acks answered "ok"
	okAt       time.Time // when the first ok answer arrived
	ambiguous  int       // acks with no definite answer (no answer, 5xx, or stale after one)
	staleAcks  int       // acks answered "stale" on their first try
	rejects    int       // non-retryable nacks sent (ok or without a definite answer)
	retryNacks int       // retryable nacks sent
	crashes    int       // deliveries dropped on purpose (the lease expires)
	extends    int
	replays    int // times a DLQ replay asked for this key
}

// History records every operation of a run and the anomalies seen while it
// ran. It is safe for concurrent use.
type History struct {
	mu         sync.Mutex
	start      time.Time
	pubs       map[string]*pubRec
	byProducer map[int][]string // keys in publish order
	groups     map[string]map[string]*keyGroup
	ops        map[string]int
	violations map[string][]string // kind → examples, found while running
	anomalies  map[string]int      // unexpected but tolerated things
	events     []string            // notable client actions (DLQ replays), for failure reports
}

// event records a notable client action with its time.
func (h *History) event(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) < 10000 {
		h.events = append(h.events, fmt.Sprintf("%s ", time.Now().UTC().Format("15:04:05.000"))+fmt.Sprintf(format, args...))
	}
}

func newHistory(groups []string) *History {
	h := &History{start: time.Now(), pubs: map[string]*pubRec{}, byProducer: map[int][]string{},
		groups: map[string]map[string]*keyGroup{}, ops: map[string]int{},
		violations: map[string][]string{}, anomalies: map[string]int{}}
	for _, g := range groups {
		h.groups[g] = map[string]*keyGroup{}
	}
	return h
}

func (h *History) op(kind string) {
	h.mu.Lock()
	h.ops[kind]++
	h.mu.Unlock()
}

func (h *History) anomaly(kind string) {
	h.mu.Lock()
	h.anomalies[kind]++
	h.mu.Unlock()
}

// violation records a failed invariant found during the run.
func (h *History) violation(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.violationLocked(kind, format, args...)
}

func (h *History) violationLocked(kind, format string, args ...any) {
	msg := fmt.Sprintf("+%.1fs ", time.Since(h.start).Seconds()) + fmt.Sprintf(format, args...)
	h.violations[kind] = append(h.violations[kind], msg)
}

// kg returns the record of key in group, creating it. Callers hold h.mu.
func (h *History) kg(group, key string) *keyGroup {
	m := h.groups[group]
	r := m[key]
	if r == nil {
		r = &keyGroup{positions: map[pos]int{}}
		m[key] = r
	}
	return r
}

// newPub registers a key before its first publish attempt.
func (h *History) newPub(r *pubRec) {
	h.mu.Lock()
	h.pubs[r.key] = r
	h.byProducer[r.producer] = append(h.byProducer[r.producer], r.key)
	h.mu.Unlock()
}

// pubAttempt counts one attempt of a key.
func (h *History) pubAttempt(key string) {
	h.mu.Lock()
	h.pubs[key].attempts++
	h.ops["publish"]++
	h.mu.Unlock()
}

// pubAcked records a 2xx answer for key. A later 2xx for a key that already
// has one must name the same position and must say duplicate.
func (h *History) pubAcked(key string, at pos, status int, duplicate bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.pubs[key]
	if !r.acked {
		r.acked, r.pos = true, at
		return
	}
	if at != r.pos || !duplicate || status != 200 {
		h.violationLocked("dedup", "key %s: first stored at %v, a repeat answered %d duplicate=%v at %v",
			key, r.pos, status, duplicate, at)
	}
}

// lookup returns a copy of the key's publish record.
func (h *History) lookup(key string) (pubRec, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.pubs[key]
	if !ok {
		return pubRec{}, false
	}
	return *r, true
}

// delivered records a fetched message; sent is when its fetch was sent.
func (h *History) delivered(group, key string, at pos, sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops["delivery"]++
	r := h.kg(group, key)
	r.deliveries++
	r.positions[at]++
	if r.oks > 0 && sent.After(r.okAt) {
		h.violationLocked("redelivered-after-ack", "group %s key %s (%v): delivered by a fetch sent %v after its ack was answered ok",
			group, key, at, sent.Sub(r.okAt).Round(time.Millisecond))
	}
}

// ackResult records the outcome of one receipt of an ack.
func (h *History) ackResult(group, key, outcome string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.kg(group, key)
	switch outcome {
	case "ok":
		r.oks++
		if r.oks == 1 {
			r.okAt = time.Now()
		}
	case "ambiguous":
		r.ambiguous++
	case "stale":
		r.staleAcks++
	}
}

func (h *History) note(group, key string, f func(*keyGroup)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h.kg(group, key))
}

// Figures are the numbers of a run.
type Figures struct {
	Seed               int64
	Elapsed            time.Duration
	Ops                map[string]int
	Faults             map[string]int
	Keys               int // idempotency keys producers tried
	Acknowledged       int // keys with a 2xx publish
	Indeterminate      int // keys given up without a 2xx
	IndeterminateFound int // ... of which the broker stored the message
	Stored             int64
	Poison             int
	Deliveries         int
	CompletedByAck     int // over all groups
	CompletedAmbiguous int // completions shown only by an ack without a definite answer
	DeadLettered       int // over all groups
	Lost               int
	Duplicated         int
	ReplicasCompared   bool     // the nodes' states were compared and equal
	GroupsCompared     []string // data-groups mode: each group compared (replicas, applied index)
	Topics             []string // data-groups mode: each topic's line
	Violations         map[string][]string
	Anomalies          map[string]int
	Events             []string
	Process            *procFigures // the processing workload's, when it ran
}

// String renders the figures for the test log.
func (f *Figures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, %v\n", f.Seed, f.Elapsed.Round(time.Second))
	reqs, evs := map[string]int{}, map[string]int{}
	total := 0
	for k, v := range f.Ops {
		if k == "delivery" || k == "crash" {
			evs[k] = v
			continue
		}
		reqs[k] = v
		total += v
	}
	fmt.Fprintf(&b, "operations (client requests): %d (%s); %s\n", total, sortedCounts(reqs), sortedCounts(evs))
	nf := 0
	for _, v := range f.Faults {
		nf += v
	}
	fmt.Fprintf(&b, "faults injected: %d (%s)\n", nf, sortedCounts(f.Faults))
	fmt.Fprintf(&b, "keys tried %d, acknowledged writes %d, indeterminate %d (stored anyway %d), stored messages %d, poison %d\n",
		f.Keys, f.Acknowledged, f.Indeterminate, f.IndeterminateFound, f.Stored, f.Poison)
	fmt.Fprintf(&b, "deliveries %d, completed by ack %d (of which shown only by an unanswered ack %d), dead-lettered %d\n",
		f.Deliveries, f.CompletedByAck+f.CompletedAmbiguous, f.CompletedAmbiguous, f.DeadLettered)
	for _, l := range f.Topics {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "lost %d, duplicated completions %d, replicas identical: %v\n", f.Lost, f.Duplicated, f.ReplicasCompared)
	if len(f.GroupsCompared) > 0 {
		fmt.Fprintf(&b, "replicas compared per group: %s\n", strings.Join(f.GroupsCompared, "; "))
	}
	if f.Process != nil {
		b.WriteString(f.Process.String())
	}
	if len(f.Anomalies) > 0 {
		fmt.Fprintf(&b, "tolerated anomalies: %s\n", sortedCounts(f.Anomalies))
	}
	if len(f.Violations) == 0 {
		b.WriteString("violations: none\n")
	} else {
		kinds := make([]string, 0, len(f.Violations))
		for k := range f.Violations {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			v := f.Violations[k]
			fmt.Fprintf(&b, "VIOLATION %s: %d\n", k, len(v))
			for i, s := range v {
				if i == 10 {
					fmt.Fprintf(&b, "    ... %d more\n", len(v)-10)
					break
				}
				fmt.Fprintf(&b, "    %s\n", s)
			}
		}
	}
	return b.String()
}

func sortedCounts(m map[string]int) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// add sums the figures of one topic's check into f (data-groups mode):
// counts add up, violations are prefixed with the topic, and the topic's
// own line is kept.
func (f *Figures) add(topic string, p *Figures) {
	for k, v := range p.Ops {
		f.Ops[k] += v
	}
	for k, v := range p.Anomalies {
		f.Anomalies[k] += v
	}
	for k, vs := range p.Violations {
		for _, v := range vs {
			f.Violations[k] = append(f.Violations[k], "topic "+topic+": "+v)
		}
	}
	f.Keys += p.Keys
	f.Acknowledged += p.Acknowledged
	f.Indeterminate += p.Indeterminate
	f.IndeterminateFound += p.IndeterminateFound
	f.Stored += p.Stored
	f.Poison += p.Poison
	f.Deliveries += p.Deliveries
	f.CompletedByAck += p.CompletedByAck
	f.CompletedAmbiguous += p.CompletedAmbiguous
	f.DeadLettered += p.DeadLettered
	f.Lost += p.Lost
	f.Duplicated += p.Duplicated
	f.Topics = append(f.Topics, fmt.Sprintf("topic %s: acknowledged writes %d, stored %d, completed by ack %d, dead-lettered %d, lost %d, duplicated completions %d",
		topic, p.Acknowledged, p.Stored, p.CompletedByAck+p.CompletedAmbiguous, p.DeadLettered, p.Lost, p.Duplicated))
}
