package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// Coalesced forwarding (docs/ARCHITECTURE.md, "Forwarding").
//
// A follower runs a publish's handler itself: it parses and validates the
// request, places its messages and encodes the command as the leader
// would. Instead of forwarding the HTTP request, it writes the command on
// a stream to the leader of the topic's raft group (the default group's,
// or a data group's): one connection per leader, taken over from an HTTP
// request to POST /v1/internal/forward (fwdstream.go). Commands are
// written as they come, whatever is queued in one write, without waiting
// for the answers to earlier ones; the leader reads what arrived together,
// checks each command against its own state, hands them to its group
// commit together (one batch), and writes each answer as soon as its batch
// committed; the follower matches answers to commands by id and writes
// the clients' answers. The leader parses no HTTP request and writes no
// answer per message, and no command waits on the follower for another's
// answer.
//
// What stays as with HTTP forwarding: the caller is authorized on the
// follower, and its token again on the leader for the command's topic; the
// request id is in both nodes' request logs; each command keeps its own
// deadline; errors map to the same statuses and codes (the leader sends
// the catalogue entry and the message); a leader that is not (or no
// longer) serving the group answers not-leader for a command it did not
// propose, which the follower retries through the next leader, so a
// graceful hand-off loses nothing. Anything the follower cannot decide from
// its own state (a topic it does not know yet, a message over its
// max_message_bytes) and any leader that does not take the stream (an
// older release: 404 or 400; a node without --node-token when TLS is off:
// 401) falls back to forwarding the HTTP request. The leader also still
// serves the earlier form, a batch of commands in one request's body and
// their answers in its response, for followers of the release before.

const (
	// coalesceMaxFrames and coalesceMaxBytes bound the commands the
	// leader checks and proposes together (one internal request's, or
	// what it read of a stream at once).
	coalesceMaxFrames = 512
	coalesceMaxBytes  = 4 << 20
	// coalesceMaxCommand: a command larger than this is forwarded as its
	// HTTP request (it is its own batch already).
	coalesceMaxCommand = 1 << 20
	// legacyFor is how long a leader that refused a stream is
	// sent HTTP forwards before it is tried again.
	legacyFor = time.Minute
	// forwardCodec versions the internal request's body (the release
	// before streams).
	forwardCodec byte = 1
	// forwardPattern is the internal route's path.
	forwardPattern = "/v1/internal/forward"
)

// errCoalesceFallback: this request is forwarded as HTTP instead; nothing
// was proposed.
var errCoalesceFallback = errors.New("forward as HTTP")

// Answer kinds of one frame.
const (
	frameOK byte = iota
	frameErr
	frameFallback
)

// fwdCall is one command a follower sends to the leader, and its answer.
// (The fields before done are the command as the earlier internal
// request carried it: in-process tests still send those.)
type fwdCall struct {
	reqID, token []byte // the caller's bearer secret, or nil
	route        string // the client's route pattern, for the leader's log
	cmd          []byte // command.Encode
	deadline     time.Time
	done         chan struct{}
	res          *fsm.Result
	err          error
}

// coalescer is a follower's streams of commands, one per leader.
type coalescer struct {
	s       *Server // the node's server: its options, metrics, log
	mu      sync.Mutex
	streams map[string]*fwdStream // leader address → its stream
	legacy  map[string]time.Time  // leader address → HTTP forwards until
}

func (c *coalescer) usable(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.legacy[addr]
	return !ok || time.Now().After(until)
}

func (c *coalescer) markLegacy(addr string) {
	c.mu.Lock()
	if c.legacy == nil {
		c.legacy = map[string]time.Time{}
	}
	c.legacy[addr] = time.Now().Add(legacyFor)
	c.mu.Unlock()
}

// call sends cmd to the leader of sv's group (the default group's or a
// data group's) on its stream and waits for its answer or for ctx.
func (c *coalescer) call(ctx context.Context, sv *Server, rctx *fasthttp.RequestCtx, r *route, cmd *command.Command) (*fsm.Result, error) {
	_, addr, ok := sv.node.Leader()
	if !ok {
		return nil, fmt.Errorf("%w: leader address unknown", replica.ErrNotLeader)
	}
	if !c.usable(addr) {
		return nil, errCoalesceFallback
	}
	enc, buf := cmd.EncodePooled()
	defer command.RecycleEnc(buf) // copied into the stream's buffer
	if len(enc) > coalesceMaxCommand {
		return nil, errCoalesceFallback
	}
	dl, _ := ctx.Deadline()
	f := &fwdCall{route: r.def.Pattern, deadline: dl, done: make(chan struct{})}
	f.reqID = rctx.Request.Header.Peek(RequestIDHeader) // copied into the stream's buffer
	if c.s.opts.Auth != nil {
		f.token, _ = auth.BearerToken(rctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	}
	for !c.stream(addr).send(f, enc) {
		// That stream just ended: the next call of stream makes a new one.
	}
	f.reqID, f.token = nil, nil // the request's buffers
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		// Sent or about to be: the leader may apply it.
		return nil, errorf(ErrUnavailable, "the leader did not answer within the request's deadline: "+
			"the request may or may not have taken effect; retry it (a publish with the same Idempotency-Key is stored once)")
	}
}

// encodeFrames is the earlier internal request's body (still served):
// the codec byte, the count, then each command's frame (appendFrame).
func encodeFrames(fs []*fwdCall, now time.Time) []byte {
	e := mlog.Enc{}
	e.Byte(forwardCodec)
	e.U64(uint64(len(fs)))
	for _, f := range fs {
		appendFrame(&e, f, f.cmd, now)
	}
	return e.B
}

// appendFrame appends one command as the leader reads it (decodeFrame):
// its request id, token, route, remaining time in ms and encoding.
func appendFrame(e *mlog.Enc, f *fwdCall, cmd []byte, now time.Time) {
	e.Bytes(f.reqID)
	e.Bytes(f.token)
	e.Str(f.route)
	e.U64(uint64(max(1, f.deadline.Sub(now).Milliseconds())))
	e.Bytes(cmd)
}

// frame is one command as the leader reads it.
type frame struct {
	reqID, token []byte
	route        string
	timeout      time.Duration
	ctx          context.Context // the timeout, from when the leader read it
	cmd          *command.Command
	size         int
	// the answer
	res *fsm.Result
	err error
	ans byte
}

// decodeFrame reads what appendFrame wrote into f; an error is the
// caller's ErrBadRequest.
func decodeFrame(d *mlog.Dec, f *frame) error {
	f.reqID, f.token, f.route = d.Bytes(), d.Bytes(), d.Str()
	ms := d.U64()
	enc := d.Bytes()
	if err := d.Err(); err != nil {
		return err
	}
	if ms < 1 || ms > uint64((maxTimeout+maxWait)/time.Millisecond) {
		return fmt.Errorf("a forwarded command's timeout %d ms", ms)
	}
	f.timeout = time.Duration(ms) * time.Millisecond
	c, err := command.Decode(enc)
	if err != nil {
		return fmt.Errorf("a forwarded command: %v", err)
	}
	f.cmd, f.size = c, len(enc)
	return nil
}

func decodeFrames(b []byte) ([]frame, error) {
	d := mlog.Dec{B: b}
	if v := d.Byte(); d.Err() == nil && v != forwardCodec {
		return nil, fmt.Errorf("%w: forward codec %d", ErrBadRequest, v)
	}
	n := d.Len(5)
	if d.Err() == nil && n > coalesceMaxFrames {
		return nil, fmt.Errorf("%w: %d commands in one forward, at most %d", ErrBadRequest, n, coalesceMaxFrames)
	}
	fs := make([]frame, n)
	for i := range fs {
		if err := decodeFrame(&d, &fs[i]); err != nil {
			return nil, fmt.Errorf("%w: forward body: %v", ErrBadRequest, err)
		}
	}
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%w: forward body: %v", ErrBadRequest, err)
	}
	if len(d.B) != 0 {
		return nil, fmt.Errorf("%w: forward body: %d bytes after its commands", ErrBadRequest, len(d.B))
	}
	return fs, nil
}

// encodeAnswers is the earlier internal request's answer: the codec byte,
// the count, then each frame's answer (appendAnswer).
func encodeAnswers(fs []frame) []byte {
	e := mlog.Enc{B: make([]byte, 0, 16+24*len(fs))}
	e.Byte(forwardCodec)
	e.U64(uint64(len(fs)))
	for i := range fs {
		appendAnswer(&e, &fs[i])
	}
	return e.B
}

// appendAnswer appends a frame's answer: its kind and, for frameOK, the
// published messages; for frameErr the catalogue index (-1: none), the
// message and the expected producer sequence.
func appendAnswer(e *mlog.Enc, f *frame) {
	e.Byte(f.ans)
	switch f.ans {
	case frameOK:
		e.U64(uint64(len(f.res.Published)))
		for _, p := range f.res.Published {
			e.U64(uint64(p.Partition))
			e.U64(p.Offset)
			e.Bool(p.Duplicate)
		}
	case frameErr:
		e.I64(int64(catalogueIndex(f.err)))
		e.Str(f.err.Error())
		var exp uint64
		if f.res != nil {
			exp = f.res.Expected
		}
		e.U64(exp)
	}
}

func decodeAnswers(b []byte, fs []*fwdCall) error {
	d := mlog.Dec{B: b}
	if v := d.Byte(); d.Err() == nil && v != forwardCodec {
		return fmt.Errorf("forward codec %d", v)
	}
	if n := d.Len(1); d.Err() == nil && n != len(fs) {
		return fmt.Errorf("%d answers to %d commands", n, len(fs))
	}
	for _, f := range fs {
		if err := decodeAnswer(&d, f); err != nil {
			return err
		}
	}
	return nil
}

// decodeAnswer reads what appendAnswer wrote into f's result and error.
func decodeAnswer(d *mlog.Dec, f *fwdCall) error {
	switch k := d.Byte(); k {
	case frameOK:
		ps := make([]fsm.Published, d.Len(3))
		for i := range ps {
			ps[i] = fsm.Published{Partition: uint32(d.U64()), Offset: d.U64(), Duplicate: d.Bool()}
		}
		f.res = &fsm.Result{Published: ps}
	case frameErr:
		i, msg, exp := d.I64(), d.Str(), d.U64()
		f.res, f.err = &fsm.Result{Expected: exp}, remoteError(int(i), msg)
	case frameFallback:
		f.err = errCoalesceFallback
	default:
		if d.Err() == nil {
			return fmt.Errorf("answer kind %d", k)
		}
	}
	return d.Err()
}

// catalogueIndex is the entry of the catalogue that classifies err, or -1.
func catalogueIndex(err error) int {
	for i, t := range catalogue {
		if errors.Is(err, t.err) {
			return i
		}
	}
	return -1
}

// wireError is an error of the leader's, as its catalogue entry and text.
type wireError struct {
	msg  string
	kind error // nil: unclassified (500)
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.kind }

func remoteError(i int, msg string) error {
	if i >= 0 && i < len(catalogue) {
		return &wireError{msg: msg, kind: catalogue[i].err}
	}
	return &wireError{msg: msg}
}

// forwarded serves POST /v1/internal/forward on the leader: a follower's
// stream of commands (streamHeader: the connection is taken over,
// fwdstream.go), or the earlier form, commands in the body answered in
// the response.
func (s *Server) forwarded(ctx *fasthttp.RequestCtx, _ *route) error {
	if len(ctx.Request.Header.Peek(streamHeader)) > 0 {
		return s.acceptStream(ctx)
	}
	fs, err := decodeFrames(ctx.PostBody())
	if err != nil {
		return err
	}
	s.runFrames(fs)
	writeBody(ctx, fasthttp.StatusOK, encodeAnswers(fs))
	ctx.Response.Header.SetContentType("application/octet-stream")
	return nil
}

// runFrames answers commands a follower forwarded: each is checked, then
// the commands of each raft group go to that group's commit together (one
// batch, so that they commit together and none waits a round for
// another's entry), and each is answered and logged.
func (s *Server) runFrames(fs []frame) {
	start := time.Now()
	var groups []fwdGroup // by raft group, in order of first use (mostly one)
	for i := range fs {
		f := &fs[i]
		var cancel context.CancelFunc
		f.ctx, cancel = context.WithTimeout(context.Background(), f.timeout)
		defer cancel()
		sv, err := s.checkForwarded(f)
		if err != nil {
			f.answer(nil, err)
			continue
		}
		j := slices.IndexFunc(groups, func(g fwdGroup) bool { return g.sv == sv })
		if j < 0 {
			j = len(groups)
			groups = append(groups, fwdGroup{sv: sv})
		}
		groups[j].fs = append(groups[j].fs, f)
	}
	var wg sync.WaitGroup
	for _, g := range groups[min(1, len(groups)):] {
		wg.Add(1)
		go func() { defer wg.Done(); g.sv.proposeForwarded(g.fs) }()
	}
	if len(groups) > 0 {
		groups[0].sv.proposeForwarded(groups[0].fs)
	}
	wg.Wait()
	took := time.Since(start)
	for i := range fs {
		s.logForwarded(&fs[i], took)
	}
}

// fwdGroup is the checked commands of one internal request that go to
// one raft group, and the server (a data group's view, or the node's) of
// that group.
type fwdGroup struct {
	sv *Server
	fs []*frame
}

// answer sets the frame's result and the kind of its answer.
func (f *frame) answer(res *fsm.Result, err error) {
	f.res, f.err = res, err
	switch {
	case errors.Is(err, errCoalesceFallback):
		f.ans = frameFallback
	case err != nil:
		f.ans = frameErr
	default:
		f.ans = frameOK
	}
}

// proposeForwarded commits the checked commands of one raft group, which
// this server leads, together, and answers each; as proposePublish does
// for one, it counts their commit time and what they published.
func (s *Server) proposeForwarded(fs []*frame) {
	ctxs, cmds := make([]context.Context, len(fs)), make([]*command.Command, len(fs))
	for i, f := range fs {
		ctxs[i], cmds[i] = f.ctx, f.cmd
	}
	start := time.Now()
	res, errs := s.node.ApplyBatchedAll(ctxs, cmds)
	took := time.Since(start)
	for i, f := range fs {
		s.metrics.commit(took, errs[i])
		if errs[i] == nil {
			s.metrics.countPublished(f.cmd.Topic, res[i].Published)
		}
		f.answer(res[i], errs[i])
	}
}

// forwardedServer is the server of topic's raft group on this node: its
// data group's view, or the node's server for the default group. A topic
// of a data group this node holds no replica of goes back to the follower
// as an HTTP forward, which is routed to the group wherever it is.
func (s *Server) forwardedServer(topic string) (*Server, error) {
	gn, ok := s.grouped()
	if !ok {
		return s, nil
	}
	id := gn.TopicGroup(topic)
	if id == "" {
		return s, nil
	}
	v, held := s.view(id)
	if !held {
		return nil, errCoalesceFallback
	}
	return v, nil
}

// checkForwarded checks one forwarded command as the leader's handler
// would have and restamps it with this node's clock; it answers the
// server of the command's raft group, which this node leads.
func (s *Server) checkForwarded(f *frame) (*Server, error) {
	c := f.cmd
	if c.Op != command.OpPublish {
		return nil, fmt.Errorf("%w: only publishes are forwarded this way", ErrBadRequest)
	}
	if !mlog.ValidName(c.Topic) {
		return nil, fmt.Errorf("%w: topic %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, c.Topic)
	}
	if s.opts.Auth != nil {
		id, ok := s.opts.Auth.Authenticate(f.token)
		if !ok {
			return nil, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
		}
		if !id.Allows(auth.Publish, c.Topic) {
			return nil, fmt.Errorf("%w: token %q lacks publish:%s", ErrForbidden, id.Name(), c.Topic)
		}
	}
	sv, err := s.forwardedServer(c.Topic)
	if err != nil {
		return nil, err
	}
	for !sv.node.IsLeader() || sv.node.HandingOff() || !sv.node.Serving() {
		if !sv.node.IsLeader() || sv.node.HandingOff() {
			return nil, fmt.Errorf("%w: node %s no longer leads", replica.ErrNotLeader, sv.node.ID())
		}
		if err := pause(f.ctx, 5*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%w: the new leader is still applying the log", replica.ErrNotLeader)
		}
	}
	cfg, err := sv.topicConfig(c.Topic)
	if err != nil {
		return nil, err
	}
	bodySize := 0
	for _, m := range c.Msgs {
		if m.Partition >= cfg.Partitions || cfg.CheckSize(len(m.Msg.Value)) != nil || m.Msg == nil || !validForwardedMsg(m.Msg) {
			// Placed for another configuration, or over the max (which
			// a repeat may be): the HTTP request decides it here.
			return nil, errCoalesceFallback
		}
		bodySize += len(m.Msg.Value)
	}
	if c.Producer != "" {
		if _, err := checkKey("Mq-Producer-Id", c.Producer); err != nil {
			return nil, err
		}
	}
	if err := sv.node.CheckDisk(bodySize); err != nil {
		return nil, err
	}
	// The follower's clock stamped it: the command carries this node's,
	// and a delayed message keeps its delay.
	now := nowMs()
	for i := range c.Msgs {
		if m := c.Msgs[i].Msg; m.DeliverAt > 0 {
			m.DeliverAt += now - c.Now
		}
	}
	c.Now = now
	return sv, nil
}

// validForwardedMsg holds a forwarded message to what a publish's headers
// or a batch's body may say (the follower checked them; the leader does
// not take another node's word for what it stores).
func validForwardedMsg(m *mlog.Message) bool {
	if m.IdempotencyKey != "" {
		if _, err := checkKey("Idempotency-Key", m.IdempotencyKey); err != nil {
			return false
		}
	}
	if len(m.Attrs) > maxAttrs || m.MaxRetry > maxRetries || m.BackoffBaseMs > maxBackoffMs || m.BackoffJitterMs > maxBackoffMs {
		return false
	}
	for _, a := range m.Attrs {
		if a.Name == "" || len(a.Name) > maxAttrName || len(a.Value) > maxAttrVal {
			return false
		}
	}
	return true
}

// logForwarded is the leader's request line for one forwarded command, as
// logRequest writes one for a request it serves.
func (s *Server) logForwarded(f *frame, took time.Duration) {
	status := 201
	switch {
	case f.ans == frameErr:
		status = classify(f.err).status
	case f.ans == frameFallback:
		status = 307 // the follower sends the HTTP request
	case len(f.res.Published) == 1 && f.res.Published[0].Duplicate:
		status = 200
	}
	level := slog.LevelDebug
	if status == 500 {
		level = slog.LevelError
	}
	if !s.logger.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("request_id", string(f.reqID)), slog.String("method", fasthttp.MethodPost),
		slog.String("route", f.route), slog.Int("status", status), slog.Duration("took", took),
		slog.String("topic", f.cmd.Topic), slog.Bool("coalesced", true))
	if len(f.cmd.Msgs) == 1 && f.cmd.Msgs[0].Msg.IdempotencyKey != "" && f.route == publishPattern {
		attrs = append(attrs, slog.String("idempotency_key", f.cmd.Msgs[0].Msg.IdempotencyKey))
	}
	if f.err != nil {
		attrs = append(attrs, slog.String("err", f.err.Error()))
	}
	s.logger.LogAttrs(context.Background(), level, "request", attrs...)
}

// publishPattern is the single publish's route.
const publishPattern = "/v1/topics/{topic}/messages"
