package api

import (
	"bytes"
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
// would. Instead of forwarding the HTTP request, it queues the command;
// at most coalesceSenders requests to the leader are in flight, each
// carrying every command queued when it left (POST /v1/internal/forward,
// over the forwarding pool's keep-alive connections). The leader checks
// each command against its own state, submits it to group commit as it
// is, and answers each one's result; the follower writes the client's
// answer. One internal request then carries many clients' publishes: the
// leader parses no HTTP request and writes no answer per message.
//
// What stays as before: the caller is authorized on the follower, and
// its token again on the leader for the command's topic; the request id
// is in both nodes' request logs; each command keeps its own deadline;
// errors map to the same statuses and codes (the leader sends the
// catalogue entry and the message); a leader that is not (or no longer)
// serving answers not-leader for a command it did not propose, which the
// follower retries through the next leader. Anything the follower cannot
// decide from its own state (a topic it does not know yet, a message over
// its max_message_bytes) and any leader that does not take coalesced
// commands (an older release: 404; a node without --node-token when TLS is
// off: 401) falls back to forwarding the HTTP request.

const (
	// coalesceSenders bounds the internal requests in flight per node:
	// while they are out, commands accumulate for the next.
	coalesceSenders = 4
	// coalesceMaxFrames and coalesceMaxBytes bound one internal request.
	coalesceMaxFrames = 512
	coalesceMaxBytes  = 4 << 20
	// coalesceMaxCommand: a command larger than this is forwarded as its
	// HTTP request (it is its own batch already).
	coalesceMaxCommand = 1 << 20
	// legacyFor is how long a leader that refused the internal route is
	// sent HTTP forwards before it is tried again.
	legacyFor = time.Minute
	// forwardCodec versions the internal request's body.
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
type fwdCall struct {
	reqID, token []byte  // the caller's bearer secret, or nil
	route        string  // the client's route pattern, for the leader's log
	cmd          []byte  // command.EncodePooled
	buf          *[]byte // cmd's pooled buffer, given back once sent
	deadline     time.Time
	done         chan struct{}
	res          *fsm.Result
	err          error
}

// coalescer queues a follower's commands for the leader.
type coalescer struct {
	s       *Server
	mu      sync.Mutex
	queue   []*fwdCall
	senders int
	legacy  map[string]time.Time // leader address → HTTP forwards until
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

// call sends cmd to the leader with the next internal request and waits
// for its answer or for ctx.
func (c *coalescer) call(ctx context.Context, rctx *fasthttp.RequestCtx, r *route, cmd *command.Command) (*fsm.Result, error) {
	_, addr, ok := c.s.node.Leader()
	if !ok {
		return nil, fmt.Errorf("%w: leader address unknown", replica.ErrNotLeader)
	}
	if !c.usable(addr) {
		return nil, errCoalesceFallback
	}
	enc, buf := cmd.EncodePooled()
	if len(enc) > coalesceMaxCommand {
		return nil, errCoalesceFallback
	}
	dl, _ := ctx.Deadline()
	// Copied: a caller whose deadline passes returns while the command may
	// still be sent, and its request's buffers are reused.
	f := &fwdCall{reqID: bytes.Clone(rctx.Request.Header.Peek(RequestIDHeader)), route: r.def.Pattern, cmd: enc, buf: buf, deadline: dl,
		done: make(chan struct{})}
	if c.s.opts.Auth != nil {
		tok, _ := auth.BearerToken(rctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
		f.token = bytes.Clone(tok)
	}
	c.mu.Lock()
	c.queue = append(c.queue, f)
	if c.senders < coalesceSenders {
		c.senders++
		go c.send()
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		// Sent or about to be: the leader may apply it.
		return nil, errorf(ErrUnavailable, "the leader did not answer within the request's deadline: "+
			"the request may or may not have taken effect; retry it (a publish with the same Idempotency-Key is stored once)")
	}
}

// send carries queued commands to the leader until the queue is empty.
func (c *coalescer) send() {
	for {
		c.mu.Lock()
		n, size := 0, 0
		for n < len(c.queue) && n < coalesceMaxFrames && (n == 0 || size+len(c.queue[n].cmd) <= coalesceMaxBytes) {
			size += len(c.queue[n].cmd)
			n++
		}
		if n == 0 {
			c.senders--
			c.mu.Unlock()
			return
		}
		batch := make([]*fwdCall, n)
		copy(batch, c.queue)
		clear(c.queue[:n])
		c.queue = c.queue[n:]
		c.mu.Unlock()
		c.roundTrip(batch)
		for _, f := range batch {
			f.cmd = nil
			command.RecycleEnc(f.buf) // copied into the request, which is done
			close(f.done)
		}
	}
}

// roundTrip sends one internal request and sets each call's answer.
func (c *coalescer) roundTrip(batch []*fwdCall) {
	fail := func(err error) {
		for _, f := range batch {
			f.err = err
		}
	}
	_, addr, ok := c.s.node.Leader()
	if !ok {
		fail(fmt.Errorf("%w: leader address unknown", replica.ErrNotLeader))
		return
	}
	now := time.Now()
	var dl time.Time
	live := batch[:0:0]
	for _, f := range batch {
		if !f.deadline.After(now) {
			f.err = errorf(ErrUnavailable, "the request's deadline passed before it was sent to the leader: nothing was sent; retry")
			continue
		}
		live = append(live, f)
		if f.deadline.After(dl) {
			dl = f.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(forwardPattern)
	req.SetHost(addr)
	req.URI().SetScheme("http")
	req.Header.SetContentType("application/octet-stream")
	if c.s.opts.TLS == nil && c.s.opts.NodeToken != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+c.s.opts.NodeToken)
	}
	body := frameBufs.Get().(*[]byte)
	*body = appendFrames((*body)[:0], live, now)
	defer func() {
		if cap(*body) <= coalesceMaxBytes {
			frameBufs.Put(body)
		}
	}()
	req.SetBodyRaw(*body)
	c.s.metrics.fwdRequests.Inc()
	c.s.metrics.fwdCommands.Add(float64(len(live)))
	if err := c.s.fwd.DoDeadline(req, resp, dl); err != nil {
		c.s.logger.Warn("coalesced forward to leader failed", "leader", addr, "commands", len(live), "err", err)
		switch {
		case isDialError(err):
			fail(fmt.Errorf("%w: %s", errLeaderUnreachable, addr))
		case errors.Is(err, fasthttp.ErrNoFreeConns):
			fail(errorf(ErrUnavailable, "every connection to the leader %s stayed busy within the request's deadline: nothing was sent; retry", addr))
		default:
			fail(errorf(ErrUnavailable, "the leader %s did not answer (%s): the request may or may not have taken effect; "+
				"retry it (a publish with the same Idempotency-Key is stored once)", addr, errKind(err)))
		}
		return
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		// Refused as a whole before any command was looked at: an older
		// leader without the route (404), no node credentials (401, 403),
		// a body it would not take. Forward these as HTTP.
		c.s.logger.Info("leader does not take coalesced forwards; forwarding HTTP requests to it",
			"leader", addr, "status", resp.StatusCode(), "for", legacyFor)
		c.markLegacy(addr)
		fail(errCoalesceFallback)
		return
	}
	if err := decodeAnswers(resp.Body(), live); err != nil {
		fail(errorf(ErrUnavailable, "the leader %s answered what this node cannot read (%v): the request may or may not have taken effect; "+
			"retry it (a publish with the same Idempotency-Key is stored once)", addr, err))
	}
}

func errKind(err error) string {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "connection lost"
}

// encodeFrames is the internal request's body: the codec byte, the count,
// then per command its request id, token, route, remaining time in ms and
// encoding.
func encodeFrames(fs []*fwdCall, now time.Time) []byte { return appendFrames(nil, fs, now) }

// frameBufs recycles internal requests' bodies.
var frameBufs = sync.Pool{New: func() any { return new([]byte) }}

// appendFrames is encodeFrames appended to b.
func appendFrames(b []byte, fs []*fwdCall, now time.Time) []byte {
	n := 16
	for _, f := range fs {
		n += len(f.cmd) + len(f.reqID) + len(f.token) + len(f.route) + 32
	}
	e := mlog.Enc{B: slices.Grow(b, n)}
	e.Byte(forwardCodec)
	e.U64(uint64(len(fs)))
	for _, f := range fs {
		e.Bytes(f.reqID)
		e.Bytes(f.token)
		e.Str(f.route)
		e.U64(uint64(max(1, f.deadline.Sub(now).Milliseconds())))
		e.Bytes(f.cmd)
	}
	return e.B
}

// frame is one command as the leader reads it.
type frame struct {
	reqID, token []byte
	route        string
	timeout      time.Duration
	cmd          *command.Command
	size         int
	// the answer
	res *fsm.Result
	err error
	ans byte
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
		f := &fs[i]
		f.reqID, f.token, f.route = d.Bytes(), d.Bytes(), d.Str()
		ms := d.U64()
		enc := d.Bytes()
		if d.Err() != nil {
			break
		}
		if ms < 1 || ms > uint64((maxTimeout+maxWait)/time.Millisecond) {
			return nil, fmt.Errorf("%w: a forwarded command's timeout %d ms", ErrBadRequest, ms)
		}
		f.timeout = time.Duration(ms) * time.Millisecond
		c, err := command.Decode(enc)
		if err != nil {
			return nil, fmt.Errorf("%w: a forwarded command: %v", ErrBadRequest, err)
		}
		f.cmd, f.size = c, len(enc)
	}
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%w: forward body: %v", ErrBadRequest, err)
	}
	if len(d.B) != 0 {
		return nil, fmt.Errorf("%w: forward body: %d bytes after its commands", ErrBadRequest, len(d.B))
	}
	return fs, nil
}

// encodeAnswers: the codec byte, then per frame its kind and, for frameOK,
// the published messages; for frameErr the catalogue index (-1: none),
// the message and the expected producer sequence.
func encodeAnswers(fs []frame) []byte {
	e := mlog.Enc{B: make([]byte, 0, 16+24*len(fs))}
	e.Byte(forwardCodec)
	e.U64(uint64(len(fs)))
	for i := range fs {
		f := &fs[i]
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
	return e.B
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
	}
	if err := d.Err(); err != nil {
		return err
	}
	return nil
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

// forwarded serves POST /v1/internal/forward on the leader: every command
// proposed in parallel (so that group commit batches them), each answered.
func (s *Server) forwarded(ctx *fasthttp.RequestCtx, _ *route) error {
	fs, err := decodeFrames(ctx.PostBody())
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Add(len(fs))
	for i := range fs {
		go func(f *frame) {
			defer wg.Done()
			start := time.Now()
			f.res, f.err = s.applyForwarded(f)
			switch {
			case errors.Is(f.err, errCoalesceFallback):
				f.ans = frameFallback
			case f.err != nil:
				f.ans = frameErr
			default:
				f.ans = frameOK
			}
			s.logForwarded(f, time.Since(start))
		}(&fs[i])
	}
	wg.Wait()
	writeBody(ctx, fasthttp.StatusOK, encodeAnswers(fs))
	ctx.Response.Header.SetContentType("application/octet-stream")
	return nil
}

// applyForwarded checks one forwarded command as the leader's handler
// would have and proposes it.
func (s *Server) applyForwarded(f *frame) (*fsm.Result, error) {
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
	rctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	for !s.node.IsLeader() || s.node.HandingOff() || !s.node.Serving() {
		if !s.node.IsLeader() || s.node.HandingOff() {
			return nil, fmt.Errorf("%w: node %s no longer leads", replica.ErrNotLeader, s.node.ID())
		}
		if err := pause(rctx, 5*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%w: the new leader is still applying the log", replica.ErrNotLeader)
		}
	}
	cfg, err := s.topicConfig(c.Topic)
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
	// The follower's clock stamped it: the command carries this node's,
	// and a delayed message keeps its delay.
	now := nowMs()
	for i := range c.Msgs {
		if m := c.Msgs[i].Msg; m.DeliverAt > 0 {
			m.DeliverAt += now - c.Now
		}
	}
	c.Now = now
	return s.proposePublish(rctx, c, bodySize)
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
