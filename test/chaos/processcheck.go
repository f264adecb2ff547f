package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// The processing workload's checks, after the faults are healed, the
// stages have drained the input topic and are stopped. The invariants:
//
//   - every input publish answered 2xx is stored (reconcile on procIn:
//     not missing), and every stored input is acked in procGroup, none
//     pending, in flight or dead (reconcile with the group); the group's
//     counters agree: acked = stored inputs, no dead letter, nothing
//     skipped;
//   - procOut, read whole through the procAudit group, holds exactly one
//     output per stored input: none missing, none twice, none for an input
//     never stored, each derived from its input (value, idempotency key),
//     and nothing else (every stored offset read);
//   - the keyed outputs: reconcile on procOut finds them all, and each
//     one's key trace counts no publish answered as its duplicate (a
//     second process call with fresh receipts for one input would be one);
//     but when procIn and procOut live in different data groups (across),
//     process publishes the outputs first and acks after (api/processacross.go):
//     a call retried or redelivered before its ack counted publishes them
//     again, deduplicated, so these are counted (Republished), and an
//     unkeyed output carries the key derived from its input's position
//     (mqd-process-...); one output per input stored is still the rule;
//   - no two process calls for one input both answered 200 non-duplicate
//     (as far as the stages' reports, which a SIGKILL may cut, show).

// procFigures are the processing workload's numbers of a run.
type procFigures struct {
	Split                                  bool
	Tried, Acked, Stored, Keyed, Traced    int
	OutputsStored                          int64
	OutputsRead                            int
	Events                                 map[string]int
	Anomalies                              map[string]int
	InputsUndetermined, UndeterminedStored int
	Across                                 bool // procIn and procOut in different data groups
	Republished                            int  // across: keyed outputs' publishes answered as duplicates
}

func (f *procFigures) String() string {
	mode := "process (one call)"
	if f.Split {
		mode = "split (publish, then ack: the broken stage)"
	}
	return fmt.Sprintf("processing workload, stage %s: inputs tried %d, acknowledged %d, stored %d (%d without a 2xx, %d of them stored), keyed outputs %d; outputs stored %d, read %d, key traces checked %d\n"+
		"stage reports and faults: %s\n", mode, f.Tried, f.Acked, f.Stored, f.InputsUndetermined, f.UndeterminedStored,
		f.Keyed, f.OutputsStored, f.OutputsRead, f.Traced, sortedCounts(f.Events)) +
		map[bool]string{true: fmt.Sprintf("process across data groups: outputs published again and deduplicated %d\n", f.Republished)}[f.Across] +
		map[bool]string{true: "processing anomalies: " + sortedCounts(f.Anomalies) + "\n"}[len(f.Anomalies) > 0]
}

// drain lets the stages run until procGroup has nothing left (twice in a
// row), then stops them.
func (pw *procWorkload) drain(c *tc.Cluster, timeout time.Duration) error {
	defer pw.killStages()
	deadline := time.Now().Add(timeout)
	lastChange, lastSig, zeroes := time.Now(), "", 0
	for time.Now().Before(deadline) {
		if time.Since(lastChange) > drainStall {
			return fmt.Errorf("processing drain stalled: no change in %v: %s", drainStall, lastSig)
		}
		time.Sleep(500 * time.Millisecond)
		s, err := procStats(c, procIn)
		if err != nil {
			continue
		}
		g := s.Groups[procGroup]
		if sig := fmt.Sprintf("%+v next %d", g, s.NextOffsets()); sig != lastSig {
			lastSig, lastChange = sig, time.Now()
		}
		if g.Backlog+g.InFlight+g.Delayed+g.ReplayPending != 0 {
			zeroes = 0
			continue
		}
		if zeroes++; zeroes >= 2 {
			return nil
		}
	}
	return fmt.Errorf("processing not drained within %v: %s", timeout, lastSig)
}

// call sends one request to the live nodes in turn until one answers
// 200, for up to a minute, and decodes the answer into out.
func call(c *tc.Cluster, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		for _, n := range c.Live() {
			rctx, rcancel := context.WithTimeout(ctx, reqTimeout)
			r, err := n.Do(rctx, method, path, body, nil)
			rcancel()
			if err == nil {
				if err = r.Expect(http.StatusOK); err == nil {
					return r.JSON(out)
				}
				var se *tc.StatusError
				if errors.As(err, &se) && se.Status/100 == 4 {
					return err
				}
			}
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s %s: %v (last: %w)", method, path, ctx.Err(), last)
}

func procStats(c *tc.Cluster, topic string) (tc.TopicStats, error) {
	var s tc.TopicStats
	err := call(c, http.MethodGet, "/v1/topics/"+topic, nil, &s)
	return s, err
}

// reconcile asks about keys in calls of at most 10,000 and merges the
// answers: missing keys, and per state (acked, pending, in_flight, dead)
// the keys of group.
func reconcile(c *tc.Cluster, topic, group string, keys []string) (missing map[string]bool, states map[string]string, err error) {
	missing, states = map[string]bool{}, map[string]string{}
	for len(keys) > 0 {
		n := min(len(keys), 10000)
		body := map[string]any{"keys": keys[:n]}
		if group != "" {
			body["group"] = group
		}
		var a tc.Reconciliation
		if err := call(c, http.MethodPost, "/v1/topics/"+topic+"/reconcile", body, &a); err != nil {
			return nil, nil, err
		}
		for _, k := range a.Missing {
			missing[k] = true
		}
		g := a.Groups[group]
		for st, ks := range map[string][]string{"acked": g.Acked, "pending": g.Pending, "in_flight": g.InFlight, "dead": g.Dead} {
			for _, k := range ks {
				states[k] = st
			}
		}
		keys = keys[n:]
	}
	return missing, states, nil
}

// check runs the checks; its violations are added to figs.
func (pw *procWorkload) check(c *tc.Cluster, figs *Figures) {
	pw.mu.Lock()
	f := &procFigures{Split: pw.cfg.ProcessSplit, Across: pw.across, Events: pw.events, Anomalies: pw.anomalies}
	var tried []string
	for k, r := range pw.inputs {
		tried = append(tried, k)
		if r.acked {
			f.Acked++
		} else {
			f.InputsUndetermined++
		}
	}
	pw.mu.Unlock()
	sort.Strings(tried)
	f.Tried = len(tried)
	figs.Process = f
	stored, err := pw.checkInputs(c, tried, f)
	if err != nil {
		pw.violation("process-check", "%v", err)
	} else if err := pw.checkOutputs(c, stored, f); err != nil {
		pw.violation("process-check", "%v", err)
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	for k, ks := range pw.keys {
		if ks.processOK > 1 {
			pw.violations["process-two-successes"] = append(pw.violations["process-two-successes"],
				fmt.Sprintf("input %s: %d process calls answered 200 non-duplicate (%d deliveries)", k, ks.processOK, ks.handles))
		}
	}
	for k, v := range pw.violations {
		figs.Violations[k] = append(figs.Violations[k], v...)
	}
}

// checkInputs reconciles procIn and returns the stored inputs.
func (pw *procWorkload) checkInputs(c *tc.Cluster, tried []string, f *procFigures) ([]string, error) {
	missing, states, err := reconcile(c, procIn, procGroup, tried)
	if err != nil {
		return nil, err
	}
	var stored []string
	for _, k := range tried {
		pw.mu.Lock()
		acked := pw.inputs[k].acked
		pw.mu.Unlock()
		if missing[k] {
			if acked {
				pw.violation("process-input-lost", "input %s: publish answered 2xx, reconcile says missing", k)
			}
			continue
		}
		stored = append(stored, k)
		if !acked {
			f.UndeterminedStored++
		}
		if st := states[k]; st != "acked" {
			pw.violation("process-input-not-acked", "input %s: state %q in group %s after the drain", k, st, procGroup)
		}
	}
	f.Stored = len(stored)
	s, err := procStats(c, procIn)
	if err != nil {
		return nil, err
	}
	g := s.Groups[procGroup]
	if s.NextOffsets() != int64(len(stored)) || g.Acked != int64(len(stored)) || g.DLQ != 0 || g.DuplicatesSkipped != 0 {
		pw.violation("process-broker-counters", "%s: %d messages stored, %d inputs reconciled as stored; group %s acked %d, dlq %d, duplicates_skipped %d",
			procIn, s.NextOffsets(), len(stored), procGroup, g.Acked, g.DLQ, g.DuplicatesSkipped)
	}
	return stored, nil
}

// checkOutputs reads procOut whole and holds it against the stored inputs.
func (pw *procWorkload) checkOutputs(c *tc.Cluster, stored []string, f *procFigures) error {
	s, err := procStats(c, procOut)
	if err != nil {
		return err
	}
	f.OutputsStored = s.NextOffsets()
	msgs, err := readAll(c, f.OutputsStored)
	if err != nil {
		return err
	}
	f.OutputsRead = len(msgs)
	if int64(len(msgs)) != f.OutputsStored {
		pw.violation("process-output-unread", "%s stores %d messages, the audit group read %d", procOut, f.OutputsStored, len(msgs))
	}
	pw.mu.Lock()
	inputs := pw.inputs
	pw.mu.Unlock()
	outs := map[string][]tc.Message{}
	for _, m := range msgs {
		v, _ := m.Value()
		parts := strings.Split(string(v), "|")
		var in *inRec
		if len(parts) == 3 {
			in = inputs[parts[1]]
		}
		switch {
		case parts[0] != "out" || in == nil:
			pw.violation("process-phantom-output", "%s %d@%d: %q is no input's output", procOut, m.Partition, m.Offset, truncate(string(v), 80))
			continue
		case parts[2] != strconv.Itoa(len(in.payload)) || !pw.outputKey(in, m.IdempotencyKey):
			pw.violation("process-wrong-output", "%s %d@%d: value %q key %q for input %s (keyed %v)", procOut, m.Partition, m.Offset, v, m.IdempotencyKey, in.key, in.keyed)
		}
		outs[in.key] = append(outs[in.key], m)
	}
	var keyed []string
	for _, k := range stored {
		switch o := outs[k]; {
		case len(o) == 0:
			pw.violation("process-missing-output", "input %s (acked in %s) has no output in %s", k, procGroup, procOut)
		case len(o) > 1:
			pw.violation("process-duplicate-output", "input %s has %d outputs in %s, at %s", k, len(o), procOut, places(o))
		}
		if inputs[k].keyed {
			keyed = append(keyed, "out-"+k)
		}
	}
	f.Keyed = len(keyed)
	return pw.checkKeyed(c, keyed, f)
}

// outputKey reports whether key is the idempotency key in's output should
// carry: out-<input key> for a keyed input; none for an unkeyed one, or,
// across data groups, the one process derives from the input's position.
func (pw *procWorkload) outputKey(in *inRec, key string) bool {
	if in.keyed {
		return key == "out-"+in.key
	}
	return key == "" || pw.across && strings.HasPrefix(key, "mqd-process-")
}

func places(ms []tc.Message) string {
	var ps []string
	for _, m := range ms {
		ps = append(ps, fmt.Sprintf("%d@%d", m.Partition, m.Offset))
	}
	return strings.Join(ps, " ")
}

// readAll fetches procOut through the audit group until it has seen want
// stored positions, or nothing new came for longer than the audit lease
// (a fetch whose answer was lost leases its messages until then), for at
// most two minutes. Each position counts once.
func readAll(c *tc.Cluster, want int64) ([]tc.Message, error) {
	const lease = 10 * time.Second
	seen := map[pos]bool{}
	var out []tc.Message
	deadline, lastNew := time.Now().Add(2*time.Minute), time.Now()
	for int64(len(out)) < want && time.Now().Before(deadline) && time.Since(lastNew) < lease+5*time.Second {
		var fr tc.FetchResult
		if err := call(c, http.MethodPost, groupPath(procOut, procAudit)+"/fetch",
			fetchBody{Max: 1000, WaitMs: 1000, LeaseMs: int(lease.Milliseconds())}, &fr); err != nil {
			return nil, err
		}
		for _, m := range fr.Messages {
			if at := (pos{m.Partition, m.Offset}); !seen[at] {
				seen[at] = true
				out = append(out, m)
				lastNew = time.Now()
			}
		}
	}
	return out, nil
}

// checkKeyed reconciles the keyed outputs and traces them (at most 3,000,
// evenly picked): no publish answered as a duplicate of one.
func (pw *procWorkload) checkKeyed(c *tc.Cluster, keyed []string, f *procFigures) error {
	missing, _, err := reconcile(c, procOut, "", keyed)
	if err != nil {
		return err
	}
	for _, k := range keyed {
		if missing[k] {
			pw.violation("process-missing-output", "output key %s: reconcile on %s says missing", k, procOut)
		}
	}
	step := max(1, len(keyed)/3000)
	for i := 0; i < len(keyed); i += step {
		var tr struct {
			Duplicates uint64 `json:"duplicates"`
		}
		if err := call(c, http.MethodGet, "/v1/topics/"+procOut+"/keys/"+url.PathEscape(keyed[i]), nil, &tr); err != nil {
			if !missing[keyed[i]] {
				pw.violation("process-check", "trace %s: %v", keyed[i], err)
			}
			continue
		}
		f.Traced++
		if pw.across {
			f.Republished += int(tr.Duplicates)
			continue
		}
		if tr.Duplicates > 0 {
			pw.violation("process-output-published-twice", "output key %s: %d publishes answered as its duplicates (the input was processed more than once)", keyed[i], tr.Duplicates)
		}
	}
	return nil
}
