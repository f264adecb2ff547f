package api

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

// Streams of coalesced commands (coalesce.go). A follower opens one per
// leader address: an HTTP/1.1 POST /v1/internal/forward with streamHeader,
// authorized as any internal route (the node's token, or its certificate
// under TLS). The leader answers 200 and takes the connection over; from
// then on it carries records, [4-byte big-endian length][body], both ways:
// follower to leader an id and a command's frame (appendFrame), leader to
// follower an id and that command's answer (appendAnswer), in the order
// the answers come.

const (
	streamHeader  = "Mq-Forward-Stream"
	streamVersion = "1"
	// streamIdle: a follower closes a stream with nothing to send or wait
	// for after this; a leader closes one it read nothing on for
	// leaderStreamIdle (longer, so that the follower closes it first and
	// no command meets a stream closing under it).
	streamIdle       = 30 * time.Second
	leaderStreamIdle = 2 * time.Minute
	// streamDialTimeout bounds the dial and the 200 of a new stream.
	streamDialTimeout  = 3 * time.Second
	streamWriteTimeout = 30 * time.Second
	// maxRecord: a command of at most coalesceMaxCommand with its request
	// id, token and route.
	maxRecord = coalesceMaxCommand + 64<<10
)

// errRecordCut: a record ended before its length; the stream is unusable.
var errRecordCut = errors.New("a record cut short")

// fwdStream is a follower's stream of commands to one leader.
type fwdStream struct {
	c    *coalescer
	addr string
	wake chan struct{} // the writer's: records to write, or the end

	mu      sync.Mutex
	conn    net.Conn            // nil until open
	out     []byte              // records not yet written
	outN    int                 // the commands in out
	spare   []byte              // the previous write's buffer, for reuse
	calls   map[uint64]*fwdCall // sent or to be sent, not yet answered
	nextID  uint64
	written uint64 // ids up to this one were handed to a write
	dead    bool
}

// stream is the stream to the leader at addr, opened when there is none.
func (c *coalescer) stream(addr string) *fwdStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.streams[addr]; st != nil {
		return st
	}
	st := &fwdStream{c: c, addr: addr, wake: make(chan struct{}, 1), calls: map[uint64]*fwdCall{}}
	if c.streams == nil {
		c.streams = map[string]*fwdStream{}
	}
	c.streams[addr] = st
	go st.run()
	return st
}

// drop forgets st, which has ended.
func (c *coalescer) drop(st *fwdStream) {
	c.mu.Lock()
	if c.streams[st.addr] == st {
		delete(c.streams, st.addr)
	}
	c.mu.Unlock()
}

// send queues f's command, enc, for the stream's next write (it is copied
// into the stream's buffer); false: the stream has ended, nothing queued.
func (st *fwdStream) send(f *fwdCall, enc []byte) bool {
	now := time.Now()
	st.mu.Lock()
	if st.dead {
		st.mu.Unlock()
		return false
	}
	st.nextID++
	id := st.nextID
	st.calls[id] = f
	at := len(st.out)
	e := mlog.Enc{B: append(st.out, 0, 0, 0, 0)}
	e.U64(id)
	appendFrame(&e, f, enc, now)
	binary.BigEndian.PutUint32(e.B[at:], uint32(len(e.B)-at-4))
	st.out = e.B
	st.outN++
	st.mu.Unlock()
	st.signal()
	return true
}

func (st *fwdStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// run opens the stream, then writes and reads it until it ends.
func (st *fwdStream) run() {
	conn, br, err := st.open()
	if err != nil {
		st.end(err)
		return
	}
	st.mu.Lock()
	st.conn = conn
	st.mu.Unlock()
	go st.writeLoop(conn)
	st.signal()
	st.end(st.readLoop(conn, br))
}

// open dials the leader and asks for a stream. Nothing has been written
// when it fails: errLeaderUnreachable, or errCoalesceFallback for a leader
// that does not take streams (an older release, or no node credentials).
func (st *fwdStream) open() (net.Conn, *bufio.Reader, error) {
	opts := st.c.s.opts
	var conn net.Conn
	var err error
	if opts.TLS != nil {
		conn, err = opts.TLS.DialTimeout(st.addr, streamDialTimeout)
	} else {
		conn, err = fasthttp.DialTimeout(st.addr, streamDialTimeout)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", errLeaderUnreachable, st.addr, err)
	}
	head := "POST " + forwardPattern + " HTTP/1.1\r\nHost: " + st.addr + "\r\n" + streamHeader + ": " + streamVersion +
		"\r\nContent-Length: 0\r\n"
	if opts.TLS == nil && opts.NodeToken != "" {
		head += "Authorization: Bearer " + opts.NodeToken + "\r\n"
	}
	_ = conn.SetDeadline(time.Now().Add(streamDialTimeout))
	br := bufio.NewReaderSize(conn, 64<<10)
	var h fasthttp.ResponseHeader
	if _, err = io.WriteString(conn, head+"\r\n"); err == nil {
		err = h.Read(br)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: %s: %v", errLeaderUnreachable, st.addr, err)
	}
	switch code := h.StatusCode(); code {
	case fasthttp.StatusOK:
	case fasthttp.StatusNotFound, fasthttp.StatusBadRequest, fasthttp.StatusUnauthorized, fasthttp.StatusForbidden:
		// An older leader without the route (404) or without streams
		// (400: it read the empty body as a batch), or no node
		// credentials: forward HTTP requests to it for a while.
		conn.Close()
		st.c.s.logger.Info("leader does not take coalesced forwards; forwarding HTTP requests to it",
			"leader", st.addr, "status", code, "for", legacyFor)
		st.c.markLegacy(st.addr)
		return nil, nil, errCoalesceFallback
	default: // 503 while it stops, 429: nothing was sent, retry
		conn.Close()
		return nil, nil, fmt.Errorf("%w: %s answered %d to a stream", errLeaderUnreachable, st.addr, code)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, br, nil
}

// writeLoop writes what is queued, all of it in one write, until the
// stream ends.
func (st *fwdStream) writeLoop(conn net.Conn) {
	for range st.wake {
		// Let the handlers that are ready to run queue their commands
		// too: answers come in batches, and so do the clients' next
		// publishes.
		runtime.Gosched()
		for {
			st.mu.Lock()
			out, n := st.out, st.outN
			if st.dead || len(out) == 0 {
				dead := st.dead
				st.mu.Unlock()
				if dead {
					return
				}
				break
			}
			st.out, st.outN, st.written = st.spare[:0], 0, st.nextID
			st.mu.Unlock()
			st.c.s.metrics.fwdRequests.Inc()
			st.c.s.metrics.fwdCommands.Add(float64(n))
			_ = conn.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
			if _, err := conn.Write(out); err != nil {
				st.end(err)
				return
			}
			st.mu.Lock()
			if cap(out) <= coalesceMaxBytes {
				st.spare = out[:0]
			}
			st.mu.Unlock()
		}
	}
}

// readLoop hands each answer to its command until the stream fails or
// has been idle for streamIdle (then it answers nil).
func (st *fwdStream) readLoop(conn net.Conn, br *bufio.Reader) error {
	for {
		_ = conn.SetReadDeadline(time.Now().Add(streamIdle))
		rec, err := readRecord(br)
		if err != nil {
			if isTimeout(err) && !errors.Is(err, errRecordCut) {
				if st.idle() {
					return nil
				}
				continue
			}
			return err
		}
		d := mlog.Dec{B: rec}
		id := d.U64()
		st.mu.Lock()
		f := st.calls[id]
		delete(st.calls, id)
		st.mu.Unlock()
		if f == nil {
			return fmt.Errorf("an answer to command %d, which waits for none", id)
		}
		if err := decodeAnswer(&d, f); err != nil {
			f.res, f.err = nil, errorf(ErrUnavailable, "the leader %s answered what this node cannot read (%v): the request may or may not have taken effect; "+
				"retry it (a publish with the same Idempotency-Key is stored once)", st.addr, err)
			close(f.done)
			return err
		}
		close(f.done)
	}
}

// idle reports whether nothing waits to be sent or answered; if so the
// stream has ended (a command sent later opens a new one).
func (st *fwdStream) idle() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.calls) == 0 && len(st.out) == 0 {
		st.dead = true
		return true
	}
	return false
}

// end closes the stream and answers every command still waiting: one never
// written was not sent (errLeaderUnreachable, or errCoalesceFallback when
// the leader refused the stream); one written may or may not have been
// applied.
func (st *fwdStream) end(err error) {
	st.mu.Lock()
	calls, written, conn := st.calls, st.written, st.conn
	st.calls, st.out, st.dead = nil, nil, true
	st.mu.Unlock()
	st.c.drop(st)
	if conn != nil {
		conn.Close()
	}
	st.signal() // the writer sees the end
	if len(calls) > 0 && !errors.Is(err, errCoalesceFallback) {
		st.c.s.logger.Warn("coalesced forward stream to leader ended", "leader", st.addr, "commands", len(calls), "err", err)
	}
	// The answers name no library error (they reach the clients): the
	// log has it.
	for id, f := range calls {
		switch {
		case id <= written:
			f.err = errorf(ErrUnavailable, "the leader %s did not answer (connection lost): the request may or may not have taken effect; "+
				"retry it (a publish with the same Idempotency-Key is stored once)", st.addr)
		case errors.Is(err, errCoalesceFallback):
			f.err = errCoalesceFallback
		default:
			f.err = fmt.Errorf("%w: %s", errLeaderUnreachable, st.addr)
		}
		close(f.done)
	}
}

// readRecord reads one record's body. An error before its first byte is
// the reader's own (a timeout there leaves the stream usable); after it,
// errRecordCut.
func readRecord(br *bufio.Reader) ([]byte, error) {
	h, err := br.Peek(4)
	if err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h)
	if n > maxRecord {
		return nil, fmt.Errorf("%w: a record of %d bytes, at most %d", errRecordCut, n, maxRecord)
	}
	_, _ = br.Discard(4)
	rec := make([]byte, n)
	if _, err := io.ReadFull(br, rec); err != nil {
		return nil, fmt.Errorf("%w: %w", errRecordCut, err)
	}
	return rec, nil
}

// recordBuffered reports whether a whole record is in br's buffer.
func recordBuffered(br *bufio.Reader) bool {
	if br.Buffered() < 4 {
		return false
	}
	h, _ := br.Peek(4)
	return br.Buffered() >= 4+int(binary.BigEndian.Uint32(h))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// acceptStream answers a follower's stream request (authorized as an
// internal route): 200, then the connection is served by serveStream.
func (s *Server) acceptStream(ctx *fasthttp.RequestCtx) error {
	if string(ctx.Request.Header.Peek(streamHeader)) != streamVersion {
		return fmt.Errorf("%w: %s %q, this node speaks %s", ErrBadRequest, streamHeader, ctx.Request.Header.Peek(streamHeader), streamVersion)
	}
	ctx.Hijack(s.serveStream)
	ctx.SetStatusCode(fasthttp.StatusOK)
	return nil
}

// serveStream reads a follower's commands until the stream ends or the
// server stops: what arrived together is checked and proposed together
// (runFrames), and each group's answers are written as soon as they are
// known, while the next commands are read. It returns once every command
// read is answered.
func (s *Server) serveStream(c net.Conn) {
	if !s.streams.add(c) {
		return // stopping
	}
	defer s.streams.remove(c)
	var wg sync.WaitGroup
	defer wg.Wait()
	br := bufio.NewReaderSize(c, 64<<10)
	w := &streamWriter{c: c}
	for s.streams.arm(c) {
		fs, ids, err := readFrames(br)
		if err != nil {
			if !isTimeout(err) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.logger.Warn("coalesced forward stream from a follower ended", "remote", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.runFrames(fs)
			w.write(encodeStreamAnswers(ids, fs))
		}()
	}
}

// readFrames reads one record, waiting for it, and then those already
// received after it, up to coalesceMaxFrames and coalesceMaxBytes.
func readFrames(br *bufio.Reader) ([]frame, []uint64, error) {
	var fs []frame
	var ids []uint64
	size := 0
	for len(fs) == 0 || (len(fs) < coalesceMaxFrames && size < coalesceMaxBytes && recordBuffered(br)) {
		rec, err := readRecord(br)
		if err != nil {
			return nil, nil, err
		}
		d := mlog.Dec{B: rec}
		var f frame
		id := d.U64()
		if err := decodeFrame(&d, &f); err != nil || len(d.B) != 0 {
			return nil, nil, fmt.Errorf("%w: a command's record: %v (%d bytes after it)", errRecordCut, err, len(d.B))
		}
		fs, ids = append(fs, f), append(ids, id)
		size += len(rec)
	}
	return fs, ids, nil
}

// encodeStreamAnswers is a record per frame: its id and its answer.
func encodeStreamAnswers(ids []uint64, fs []frame) []byte {
	e := mlog.Enc{B: make([]byte, 0, 32*len(fs))}
	for i := range fs {
		at := len(e.B)
		e.B = append(e.B, 0, 0, 0, 0)
		e.U64(ids[i])
		appendAnswer(&e, &fs[i])
		binary.BigEndian.PutUint32(e.B[at:], uint32(len(e.B)-at-4))
	}
	return e.B
}

// streamWriter writes a stream's answers: whoever finds it idle writes
// what the others queue meanwhile too, in one write each time.
type streamWriter struct {
	c    net.Conn
	mu   sync.Mutex
	buf  []byte
	busy bool
	err  error
}

func (w *streamWriter) write(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	w.buf = append(w.buf, b...)
	if w.busy {
		return
	}
	w.busy = true
	for len(w.buf) > 0 && w.err == nil {
		out := w.buf
		w.buf = nil
		w.mu.Unlock()
		_ = w.c.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		_, err := w.c.Write(out)
		w.mu.Lock()
		if err != nil {
			w.err = err
			w.c.Close() // ends the reading too
		}
	}
	w.busy = false
}

// leaderStreams are the followers' streams a node serves, so that
// Shutdown can end them: it stops their reading, and waits until what
// they read is answered.
type leaderStreams struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
}

func (l *leaderStreams) add(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if l.conns == nil {
		l.conns = map[net.Conn]struct{}{}
	}
	l.conns[c] = struct{}{}
	l.wg.Add(1)
	return true
}

func (l *leaderStreams) remove(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.wg.Done()
}

// arm sets c's read deadline for the next record; false once stopping.
func (l *leaderStreams) arm(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(leaderStreamIdle))
	return true
}

// stop ends every stream's reading and waits (within done) until each
// has answered what it read.
func (l *leaderStreams) stop(done <-chan struct{}) {
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.SetReadDeadline(time.Now())
	}
	l.mu.Unlock()
	finished := make(chan struct{})
	go func() { l.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-done:
	}
}
