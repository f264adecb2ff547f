package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

// A process call whose outputs go to topics of other raft groups than
// its input's (data groups: views.go) cannot be one raft command. It keeps
// exactly-once by order and keys: first each foreign topic's outputs are
// published as a batch (through this node's own HTTP API, which routes
// them to their group's leader), every output without an idempotency key
// given one derived from the input messages' positions; then the input is
// acked with the outputs of its own group as one command. A failure
// between the two leaves the input unacked: its redelivery, processed
// again, publishes the same keys, which the output topics answer as
// duplicates, and acks. A reader of an output topic may see the outputs
// before the ack (docs/API.md, Exactly-once processing). What would refuse
// the call and can be told before the first publish is checked first
// (checkAcross), so that a refused call publishes nothing.

// foreignOutputs are the indexes of the outputs whose topic lives in
// another raft group than this server's (the default group, or its view's
// data group).
func (s *Server) foreignOutputs(outs []processOut) []int {
	gn, ok := s.top.grouped()
	if !ok {
		return nil
	}
	dir := gn.Directory()
	if len(dir.Topics) == 0 {
		return nil
	}
	var idx []int
	for i, o := range outs {
		if dir.GroupOf(o.Topic) != s.group {
			idx = append(idx, i)
		}
	}
	return idx
}

// processKeyPrefix starts the idempotency keys derived for outputs.
const processKeyPrefix = "mqd-process-"

// derivedKey is the idempotency key of output i of a process call that
// acks the messages at rs of topic/group: the same for every delivery of
// those messages, whatever the receipts' delivery counts.
func derivedKey(topic, grp string, rs []group.Receipt, i int) string {
	pos := make([]string, len(rs))
	for j, r := range rs {
		pos[j] = strconv.FormatUint(uint64(r.Partition), 10) + ":" + strconv.FormatUint(r.Offset, 10)
	}
	slices.Sort(pos)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s", topic, grp, strings.Join(pos, ","))
	return processKeyPrefix + hex.EncodeToString(h.Sum(nil)[:16]) + "-" + strconv.Itoa(i)
}

// processAcross is process with outputs in other raft groups (foreign:
// their indexes in b.Publish).
func (s *Server) processAcross(ctx *fasthttp.RequestCtx, r *route, b *processBody, foreign []int) error {
	local := processBody{Ack: b.Ack}
	isForeign := make([]bool, len(b.Publish))
	for _, i := range foreign {
		isForeign[i] = true
	}
	for i, o := range b.Publish {
		if !isForeign[i] {
			local.Publish = append(local.Publish, o)
		}
	}
	cmd, idx, err := s.processCommand(r, &local)
	if written, err := s.refuseProcess(ctx, b.Ack, err); written || err != nil {
		return err
	}
	for _, i := range foreign {
		if b.Publish[i].IdempotencyKey == nil {
			k := derivedKey(r.topic, r.group, cmd.Receipts, i)
			b.Publish[i].IdempotencyKey = &k
		}
	}
	unchecked, written, err := s.checkAcross(ctx, r, b, cmd, idx, foreign)
	if written || err != nil {
		return err
	}
	// The foreign outputs, each topic's as one batch, in request order;
	// the topics this node could not check first, so that a refusal of
	// one of them (the only one, usually) comes before anything is
	// published.
	results := make([]publishAnswer, len(b.Publish))
	byTopic := map[string][]int{}
	var topics []string
	for _, i := range foreign {
		t := b.Publish[i].Topic
		if _, seen := byTopic[t]; !seen {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	slices.SortStableFunc(topics, func(a, b string) int {
		switch {
		case unchecked[a] == unchecked[b]:
			return 0
		case unchecked[a]:
			return -1
		}
		return 1
	})
	for _, t := range topics {
		msgs := make([]batchMsg, 0, len(byTopic[t]))
		for _, i := range byTopic[t] {
			msgs = append(msgs, b.Publish[i].batchMsg)
		}
		ans, err := s.publishElsewhere(ctx, r, t, msgs)
		var pa *passedAnswer
		if errors.As(err, &pa) {
			// Refused there (a bad output, a full topic, no quorum): that
			// answer is this call's, and nothing was acked.
			if pa.retryAfter != "" {
				ctx.Response.Header.Set("Retry-After", pa.retryAfter)
			}
			ctx.Response.Header.SetContentType("application/json")
			writeBody(ctx, pa.status, pa.body)
			return nil
		}
		if err != nil {
			return err
		}
		for j, i := range byTopic[t] {
			results[i] = ans[j]
		}
	}
	// Then the ack, with the outputs of the input's own group.
	res, err := s.node.ApplyBatched(r.ctx, cmd)
	if errors.Is(err, group.ErrGroupNotFound) || errors.Is(err, fsm.ErrStaleReceipt) {
		rr, serr := staleReceipts(err, r, b.Ack, idx, res)
		writeStale(ctx, serr, rr)
		return nil
	}
	if err != nil {
		return err
	}
	pr := res.Process
	j := 0
	for i := range b.Publish {
		if isForeign[i] || j >= len(pr.Outputs) {
			continue
		}
		o := pr.Outputs[j]
		results[i] = publishAnswer{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, Duplicate: o.Duplicate}
		j++
	}
	if !pr.Duplicate {
		s.countProcess(pr)
	}
	writeJSON(ctx, 200, processAnswer{Acked: pr.Acked, Duplicate: pr.Duplicate, Results: results})
	return nil
}

// checkAcross refuses, before any foreign output is published, what the
// ack or an output topic's batch would refuse and this node can tell now:
// a call refused after publishing would leave its outputs published, and
// a later call with the same inputs would find them stored under its keys.
// The receipts are checked in the input's group as the ack checks them
// (process runs on that group's leader, so its state holds every lease it
// granted, and a lease only ends: what is refused here the ack would
// refuse), unless an earlier process call's kept outcome answers them (a
// repeat, answered by the ack); each foreign output as processOutput
// checks a local one (name, fields, topic, size), in its topic's group's
// state where this node holds a replica. It reports whether it wrote the
// answer, and the output topics it could not check (held nowhere here, or
// not found by a replica that does not lead its group and may lag).
func (s *Server) checkAcross(ctx *fasthttp.RequestCtx, r *route, b *processBody, cmd *command.Command, idx, foreign []int) (unchecked map[string]bool, written bool, err error) {
	var st []string
	var repeat bool
	err = s.state.Read(func(rd *fsm.Reader) error {
		var err error
		st, repeat, err = rd.ProcessReceipts(r.topic, r.group, cmd.Now, cmd.Receipts)
		return err
	})
	bad := 0
	for _, x := range st {
		if x != group.StatusOK {
			bad++
		}
	}
	switch {
	case errors.Is(err, group.ErrGroupNotFound):
		rr, serr := staleReceipts(err, r, b.Ack, idx, nil)
		writeStale(ctx, serr, rr)
		return nil, true, nil
	case err == nil && bad > 0 && !repeat:
		err = fmt.Errorf("%w: %d of %d receipts", fsm.ErrStaleReceipt, bad, len(st))
		rr, serr := staleReceipts(err, r, b.Ack, idx, &fsm.Result{Statuses: st})
		writeStale(ctx, serr, rr)
		return nil, true, nil
	}
	unchecked = map[string]bool{}
	for _, i := range foreign {
		o := &b.Publish[i]
		v, leads := s.outputServer(o.Topic)
		if _, err := v.processOutput(o, i); err != nil {
			if errors.Is(err, mlog.ErrTopicNotFound) && !leads {
				unchecked[o.Topic] = true
				continue
			}
			return nil, false, err
		}
	}
	return unchecked, false, nil
}

// outputServer is the server of the raft group that holds topic on this
// node, with whether it serves as that group's leader; without a replica
// here, s (which checks an output's name and fields, and finds no topic).
func (s *Server) outputServer(topic string) (*Server, bool) {
	gn, ok := s.top.grouped()
	if !ok {
		return s, false
	}
	v, held := s.top, true
	if id := gn.TopicGroup(topic); id != "" {
		v, held = s.top.view(id)
	}
	if !held {
		return s, false
	}
	return v, v.node.Serving()
}

// publishElsewhere publishes msgs to topic as one batch through this
// node's own HTTP API (which serves or forwards it to the topic's group),
// as the caller: with the request's Authorization header and deadline. An
// answer other than 200 is a *passedAnswer.
func (s *Server) publishElsewhere(ctx *fasthttp.RequestCtx, r *route, topic string, msgs []batchMsg) ([]publishAnswer, error) {
	body, err := json.Marshal(batchBody{Messages: msgs})
	if err != nil {
		return nil, err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("http://" + s.node.Info().HTTPAddr + "/v1/topics/" + url.PathEscape(topic) + "/messages:batch")
	req.Header.SetContentType("application/json")
	if a := ctx.Request.Header.Peek("Authorization"); len(a) > 0 {
		req.Header.SetBytesV("Authorization", a)
	}
	dl, ok := r.ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultTimeout)
	}
	req.Header.Set("Mq-Timeout-Ms", strconv.FormatInt(max(1, time.Until(dl).Milliseconds()), 10))
	req.SetBodyRaw(body)
	if err := s.fwd.DoDeadline(req, resp, dl); err != nil {
		return nil, errorf(ErrUnavailable, "process: publishing the outputs to topic %s: %v; nothing was acked, retry", topic, err)
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, &passedAnswer{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), retryAfter: string(resp.Header.Peek("Retry-After"))}
	}
	var ans struct {
		Results []publishAnswer `json:"results"`
	}
	if err := json.Unmarshal(resp.Body(), &ans); err != nil || len(ans.Results) != len(msgs) {
		return nil, fmt.Errorf("process: the batch answer of topic %s: %d results for %d outputs (%v)", topic, len(ans.Results), len(msgs), err)
	}
	return ans.Results, nil
}

// passedAnswer is the answer of an inner request, written as this
// request's.
type passedAnswer struct {
	status     int
	body       []byte
	retryAfter string
}

func (e *passedAnswer) Error() string {
	return fmt.Sprintf("process: publishing the outputs answered %d: %s", e.status, e.body)
}
