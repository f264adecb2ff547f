package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// The workload: producers publish uniquely keyed messages and retry each key
// until it is acknowledged; consumers in several groups fetch, and ack, nack,
// reject, extend or drop (a "crash": the lease expires) what they get; a
// replayer moves non-poison dead letters back. Every request goes to a node
// picked at random, running or not.

const (
	reqTimeout   = 8 * time.Second // client side; above the broker deadline below
	brokerTimout = "4000"          // Mq-Timeout-Ms for every request
	fetchWaitMs  = 500
	fetchLeaseMs = 2000
	fetchMax     = 5
)

// workload runs the clients of one run.
type workload struct {
	cfg   Config
	topic string
	nodes []*tc.Node
	h     *History

	stopNew   atomic.Bool // producers: start no new key
	polite    atomic.Bool // consumers: ack everything but poison, no more faults of their own
	stopCons  atomic.Bool // consumers: stop
	stopRepl  atomic.Bool // replayer: stop
	finishBy  atomic.Int64
	prodWG    sync.WaitGroup
	consWG    sync.WaitGroup
	replWG    sync.WaitGroup
	prodLeft  atomic.Int64
	seqPrefix string
	salt      uint64 // mixed into every client's seed: the workloads of several topics draw apart
}

func newWorkload(cfg Config, topic string, nodes []*tc.Node, h *History) *workload {
	w := &workload{cfg: cfg, topic: topic, nodes: nodes, h: h, seqPrefix: fmt.Sprintf("s%d", cfg.Seed)}
	w.finishBy.Store(time.Now().Add(24 * time.Hour).UnixNano())
	return w
}

func (w *workload) start() {
	for i := range w.cfg.Producers {
		w.prodWG.Add(1)
		w.prodLeft.Add(1)
		go func() {
			defer w.prodWG.Done()
			defer w.prodLeft.Add(-1)
			w.producer(i)
		}()
	}
	for gi, g := range w.cfg.Groups {
		for ci := range w.cfg.ConsumersPerGroup {
			w.consWG.Add(1)
			go func() {
				defer w.consWG.Done()
				w.consumer(g, rand.New(rand.NewPCG(uint64(w.cfg.Seed), uint64(1000+gi*100+ci)^w.salt)))
			}()
		}
	}
	if w.cfg.NoReplay {
		return
	}
	w.replWG.Add(1)
	go func() {
		defer w.replWG.Done()
		w.replayer(rand.New(rand.NewPCG(uint64(w.cfg.Seed), 999^w.salt)))
	}()
}

func (w *workload) node(rng *rand.Rand) *tc.Node { return w.nodes[rng.IntN(len(w.nodes))] }

func (w *workload) do(n *tc.Node, method, path string, body any, hdr map[string]string) (*tc.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	if hdr == nil {
		hdr = map[string]string{}
	}
	hdr["Mq-Timeout-Ms"] = brokerTimout
	return n.Do(ctx, method, path, body, hdr)
}

// expectedStatus reports whether a status is one the contract allows for a
// well-formed request under faults: 2xx or 503.
func expectedStatus(s int) bool { return s/100 == 2 || s == http.StatusServiceUnavailable }

func (w *workload) unexpected(what string, r *tc.Response) {
	code, _ := r.CheckError()
	w.h.violation("unexpected-status", "%s via %s: status %d %s %s", what, strings.TrimPrefix(r.URL, "http://"),
		r.Status, code, truncate(string(r.Body), 200))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func sleepRand(rng *rand.Rand, min, max time.Duration) {
	time.Sleep(min + time.Duration(rng.Int64N(int64(max-min)+1)))
}

// payload is determined by the key, so the checker can recognise it.
func payload(key string, poison bool, seq int) string {
	p := "0"
	if poison {
		p = "1"
	}
	return key + "|" + p + "|" + strings.Repeat("x", seq%97)
}

// parsePayload returns the key and poison flag of a payload made by payload.
func parsePayload(b []byte) (key string, poison bool, ok bool) {
	parts := strings.SplitN(string(b), "|", 3)
	if len(parts) != 3 || (parts[1] != "0" && parts[1] != "1") {
		return "", false, false
	}
	return parts[0], parts[1] == "1", true
}

func (w *workload) producer(i int) {
	rng := rand.New(rand.NewPCG(uint64(w.cfg.Seed), uint64(i)^w.salt))
	partKey := fmt.Sprintf("producer-%d", i)
	var acked []*pubRec
	for seq := 0; !w.stopNew.Load(); seq++ {
		key := fmt.Sprintf("%s-p%d-%06d", w.seqPrefix, i, seq)
		poison := rng.Float64() < w.cfg.PoisonRate
		rec := &pubRec{key: key, payload: payload(key, poison, seq), producer: i, seq: seq, poison: poison}
		w.h.newPub(rec)
		if w.publishUntilAcked(rng, rec, partKey) {
			acked = append(acked, rec)
		}
		// Now and then repeat an acknowledged key: publish dedup must answer
		// 200 duplicate with the original placement.
		if len(acked) > 0 && rng.Float64() < 0.03 {
			old := acked[rng.IntN(len(acked))]
			w.publishOnce(rng, old, partKey)
		}
		sleepRand(rng, w.cfg.ProducerPause/2, w.cfg.ProducerPause*3/2)
	}
}

// publishOnce sends one attempt; it reports whether a 2xx came back.
func (w *workload) publishOnce(rng *rand.Rand, rec *pubRec, partKey string) bool {
	w.h.pubAttempt(rec.key)
	n := w.node(rng)
	r, err := w.do(n, http.MethodPost, "/v1/topics/"+w.topic+"/messages", []byte(rec.payload),
		map[string]string{"Idempotency-Key": rec.key, "Mq-Partition-Key": partKey})
	if err != nil {
		w.h.anomaly("publish: no answer")
		return false
	}
	if !expectedStatus(r.Status) {
		w.unexpected("publish "+rec.key, r)
		return false
	}
	if r.Status == http.StatusServiceUnavailable {
		w.h.anomaly("publish: 503")
		return false
	}
	var pr tc.PublishResult
	if err := r.JSON(&pr); err != nil {
		w.h.violation("bad-answer", "publish %s: %v", rec.key, err)
		return false
	}
	w.h.pubAcked(rec.key, pos{pr.Partition, pr.Offset}, r.Status, pr.Duplicate)
	return true
}

// publishUntilAcked retries the same key until a 2xx or the finish deadline.
func (w *workload) publishUntilAcked(rng *rand.Rand, rec *pubRec, partKey string) bool {
	for {
		if w.publishOnce(rng, rec, partKey) {
			return true
		}
		if time.Now().UnixNano() > w.finishBy.Load() {
			w.h.mu.Lock()
			w.h.pubs[rec.key].givenUp = true
			w.h.mu.Unlock()
			return false
		}
		sleepRand(rng, 50*time.Millisecond, 250*time.Millisecond)
	}
}

// Consumers.

type fetchBody struct {
	Max     int `json:"max"`
	WaitMs  int `json:"wait_ms"`
	LeaseMs int `json:"lease_ms"`
}

func groupPath(topic, group string) string {
	return "/v1/topics/" + url.PathEscape(topic) + "/groups/" + url.PathEscape(group)
}

type action int

const (
	actAck action = iota
	actNack
	actReject
	actCrash
	actExtend
	actPoison
)

func (w *workload) consumer(group string, rng *rand.Rand) {
	gp := groupPath(w.topic, group)
	for !w.stopCons.Load() {
		n := w.node(rng)
		sent := time.Now()
		w.h.op("fetch")
		r, err := w.do(n, http.MethodPost, gp+"/fetch", fetchBody{Max: fetchMax, WaitMs: fetchWaitMs, LeaseMs: fetchLeaseMs}, nil)
		if err != nil {
			w.h.anomaly("fetch: no answer")
			sleepRand(rng, 50*time.Millisecond, 200*time.Millisecond)
			continue
		}
		if !expectedStatus(r.Status) {
			w.unexpected("fetch "+group, r)
			sleepRand(rng, 50*time.Millisecond, 200*time.Millisecond)
			continue
		}
		if r.Status != http.StatusOK {
			w.h.anomaly("fetch: 503")
			sleepRand(rng, 50*time.Millisecond, 200*time.Millisecond)
			continue
		}
		var fr tc.FetchResult
		if err := r.JSON(&fr); err != nil {
			w.h.violation("bad-answer", "fetch: %v", err)
			continue
		}
		if len(fr.Messages) == 0 {
			continue
		}
		var acks, nacks, rejects, poisons, extends []tc.Message
		for _, m := range fr.Messages {
			key, ok := w.checkDelivery(group, m, sent)
			if !ok {
				// Not ours: complete it so it does not come back, and move on.
				acks = append(acks, m)
				continue
			}
			switch w.decide(rng, m, key) {
			case actAck:
				acks = append(acks, m)
			case actNack:
				nacks = append(nacks, m)
			case actReject:
				rejects = append(rejects, m)
			case actPoison:
				poisons = append(poisons, m)
			case actExtend:
				extends = append(extends, m)
			case actCrash:
				w.h.note(group, m.IdempotencyKey, func(k *keyGroup) { k.crashes++ })
				w.h.op("crash")
			}
		}
		// A little processing time.
		sleepRand(rng, 0, 20*time.Millisecond)
		if len(extends) > 0 {
			acks = append(acks, w.extend(rng, group, extends)...)
		}
		if len(acks) > 0 {
			w.ack(rng, group, acks)
		}
		if len(nacks) > 0 {
			w.nack(rng, group, nacks, "retry", true)
		}
		if len(poisons) > 0 {
			w.nack(rng, group, poisons, "poison", true)
		}
		if len(rejects) > 0 {
			w.nack(rng, group, rejects, "reject", false)
		}
	}
}

// checkDelivery validates a fetched message against what was published and
// records it; it returns the key and whether the message is a known one.
func (w *workload) checkDelivery(group string, m tc.Message, sent time.Time) (string, bool) {
	at := pos{m.Partition, m.Offset}
	v, err := m.Value()
	if err != nil {
		w.h.violation("phantom", "group %s %v: value_b64 %q does not decode", group, at, m.ValueB64)
		return "", false
	}
	key, _, ok := parsePayload(v)
	rec, known := w.h.lookup(m.IdempotencyKey)
	switch {
	case !ok || !known:
		w.h.violation("phantom", "group %s %v: delivered key %q payload %q was never published", group, at, m.IdempotencyKey, truncate(string(v), 60))
		return "", false
	case key != m.IdempotencyKey || string(v) != rec.payload:
		w.h.violation("phantom", "group %s %v: key %q delivered with payload %q, published %q", group, at, m.IdempotencyKey, truncate(string(v), 60), truncate(rec.payload, 60))
		return "", false
	}
	w.h.delivered(group, m.IdempotencyKey, at, sent)
	return m.IdempotencyKey, true
}

func (w *workload) decide(rng *rand.Rand, m tc.Message, key string) action {
	rec, _ := w.h.lookup(key)
	if rec.poison {
		return actPoison
	}
	if w.polite.Load() {
		return actAck
	}
	x := rng.Float64()
	switch {
	case x < 0.80:
		return actAck
	case x < 0.88:
		return actNack
	case x < 0.90:
		return actReject
	case x < 0.95:
		return actCrash
	default:
		return actExtend
	}
}

// receiptsCall sends ack/nack/extend for msgs, retrying calls without a
// definite answer up to three times; it returns, per message, "ok", "stale",
// "invalid", or "ambiguous" (no definite answer, or "stale" after a try
// without one: the earlier try may have been applied).
func (w *workload) receiptsCall(rng *rand.Rand, op, group string, msgs []tc.Message, extra map[string]any) []string {
	receipts := make([]string, len(msgs))
	for i, m := range msgs {
		receipts[i] = m.Receipt
	}
	body := map[string]any{"receipts": receipts}
	for k, v := range extra {
		body[k] = v
	}
	out := make([]string, len(msgs))
	for i := range out {
		out[i] = "ambiguous"
	}
	uncertain := false
	for try := 0; try < 3; try++ {
		if try > 0 {
			sleepRand(rng, 50*time.Millisecond, 150*time.Millisecond)
		}
		w.h.op(op)
		r, err := w.do(w.node(rng), http.MethodPost, groupPath(w.topic, group)+"/"+op, body, nil)
		if err != nil {
			w.h.anomaly(op + ": no answer")
			uncertain = true
			continue
		}
		if !expectedStatus(r.Status) {
			w.unexpected(op+" "+group, r)
			return out // a refused request changes nothing, but this is a bug anyway
		}
		if r.Status != http.StatusOK {
			w.h.anomaly(op + ": 503")
			uncertain = true
			continue
		}
		var rr tc.ReceiptResults
		if err := r.JSON(&rr); err != nil || len(rr.Results) != len(msgs) {
			w.h.violation("bad-answer", "%s: %d results for %d receipts (%v): %s", op, len(rr.Results), len(msgs), err, truncate(string(r.Body), 200))
			return out
		}
		for i, res := range rr.Results {
			switch res.Status {
			case "ok":
				out[i] = "ok"
			case "stale":
				if uncertain {
					out[i] = "ambiguous"
				} else {
					out[i] = "stale"
				}
			case "invalid":
				out[i] = "invalid"
				w.h.violation("invalid-receipt", "%s group %s %d@%d key %s: a receipt the broker issued answered invalid",
					op, group, msgs[i].Partition, msgs[i].Offset, msgs[i].IdempotencyKey)
			default:
				w.h.violation("bad-answer", "%s: receipt status %q", op, res.Status)
			}
		}
		return out
	}
	return out
}

func (w *workload) ack(rng *rand.Rand, group string, msgs []tc.Message) {
	res := w.receiptsCall(rng, "ack", group, msgs, nil)
	for i, m := range msgs {
		if _, known := w.h.lookup(m.IdempotencyKey); !known {
			continue
		}
		w.h.ackResult(group, m.IdempotencyKey, res[i])
	}
}

func (w *workload) nack(rng *rand.Rand, group string, msgs []tc.Message, reason string, retryable bool) {
	res := w.receiptsCall(rng, "nack", group, msgs, map[string]any{"reason": reason + " " + group, "retryable": retryable})
	for i, m := range msgs {
		k := m.IdempotencyKey
		switch {
		case !retryable && (res[i] == "ok" || res[i] == "ambiguous"):
			w.h.note(group, k, func(kg *keyGroup) { kg.rejects++ })
		case retryable:
			w.h.note(group, k, func(kg *keyGroup) { kg.retryNacks++ })
		}
	}
}

// extend extends the leases and returns the messages whose extension was ok.
func (w *workload) extend(rng *rand.Rand, group string, msgs []tc.Message) []tc.Message {
	res := w.receiptsCall(rng, "extend", group, msgs, map[string]any{"lease_ms": 3000})
	var out []tc.Message
	for i, m := range msgs {
		w.h.note(group, m.IdempotencyKey, func(kg *keyGroup) { kg.extends++ })
		switch res[i] {
		case "ok":
			out = append(out, m)
		case "ambiguous":
			out = append(out, m) // the lease may still be ours: try the ack
		}
	}
	return out
}

// Replayer.

type deadLetter struct {
	ID             uint64 `json:"id"`
	Partition      int    `json:"partition"`
	Offset         int64  `json:"offset"`
	ValueB64       string `json:"value_b64"`
	IdempotencyKey string `json:"idempotency_key"`
	RejectReason   string `json:"reject_reason"`
	RetryCount     int    `json:"retry_count"`
	History        []struct {
		Kind   string `json:"kind"`
		Reason string `json:"reason"`
		Node   string `json:"node"`
	} `json:"history"`
}

type dlqPage struct {
	DeadLetters []deadLetter `json:"dead_letters"`
	NextAfter   *uint64      `json:"next_after"`
}

func (w *workload) replayer(rng *rand.Rand) {
	for !w.stopRepl.Load() {
		sleepRand(rng, 2*time.Second, 5*time.Second)
		if w.stopRepl.Load() {
			return
		}
		group := w.cfg.Groups[rng.IntN(len(w.cfg.Groups))]
		w.h.op("dlq-list")
		r, err := w.do(w.node(rng), http.MethodGet, groupPath(w.topic, group)+"/dlq?limit=50", nil, nil)
		if err != nil || r.Status != http.StatusOK {
			if err == nil && !expectedStatus(r.Status) {
				w.unexpected("dlq list", r)
			}
			continue
		}
		var page dlqPage
		if err := r.JSON(&page); err != nil {
			w.h.violation("bad-answer", "dlq list: %v", err)
			continue
		}
		var ids []uint64
		var keys []string
		for _, d := range page.DeadLetters {
			if rec, ok := w.h.lookup(d.IdempotencyKey); ok && !rec.poison && rng.Float64() < 0.7 {
				ids = append(ids, d.ID)
				keys = append(keys, d.IdempotencyKey)
			}
		}
		if len(ids) == 0 {
			continue
		}
		w.h.op("dlq-replay")
		r, err = w.do(w.node(rng), http.MethodPost, groupPath(w.topic, group)+"/dlq/replay",
			map[string]any{"ids": ids, "rate_per_sec": 200}, nil)
		switch {
		case err != nil:
			w.h.anomaly("dlq-replay: no answer")
			w.h.event("replay %s ids %v keys %v: no answer: %v", group, ids, keys, err)
		case !expectedStatus(r.Status):
			w.unexpected("dlq replay", r)
		default:
			w.h.event("replay %s ids %v keys %v: %d %s", group, ids, keys, r.Status, strings.TrimSpace(truncate(string(r.Body), 100)))
		}
		for _, k := range keys {
			w.h.note(group, k, func(kg *keyGroup) { kg.replays++ })
		}
	}
}

// readDLQ lists a group's whole dead-letter store, page by page.
func readDLQ(ctx context.Context, n *tc.Node, topic, group string) ([]deadLetter, error) {
	var out []deadLetter
	after := uint64(0)
	for {
		q := "/dlq?limit=200"
		if after > 0 {
			q += "&after=" + strconv.FormatUint(after, 10)
		}
		rctx, cancel := context.WithTimeout(ctx, reqTimeout)
		r, err := n.Do(rctx, http.MethodGet, groupPath(topic, group)+q, nil, nil)
		cancel()
		if err != nil {
			return nil, err
		}
		if err := r.Expect(http.StatusOK); err != nil {
			return nil, err
		}
		var page dlqPage
		if err := json.Unmarshal(r.Body, &page); err != nil {
			return nil, err
		}
		out = append(out, page.DeadLetters...)
		if page.NextAfter == nil {
			return out, nil
		}
		if *page.NextAfter <= after {
			return nil, fmt.Errorf("dlq paging does not advance: after %d, next_after %d", after, *page.NextAfter)
		}
		after = *page.NextAfter
	}
}
