// Package faultproxy is an HTTP proxy put in front of one mqd node by the
// client conformance suite (test/clients/conformance_test.go). It forwards every
// request to its node and, when a rule matches, injects a fault instead:
// the answer lost after the node handled the request (the ambiguous outcome),
// a reset before forwarding, a made-up error answer (503 or 429 with
// Retry-After, any 4xx), a delay, or the node killed. Every request it sees
// is recorded, so a test can check what a client sent and when.
//
// Several proxies (one per node) share one Set: its rules count matching
// requests across all of them.
package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Fault kinds of a Rule.
const (
	DropAnswer = "drop_answer" // forward, let the node answer, then reset the client's connection
	Reset      = "reset"       // reset the client's connection without forwarding
	Respond    = "respond"     // answer Status with an error body, without forwarding
	Delay      = "delay"       // wait DelayMs, then forward
	Kill       = "kill"        // call Set.OnKill for this proxy, then reset the connection
)

// Rule injects one fault into the requests it matches.
type Rule struct {
	Method string `json:"method"`
	Path   string `json:"path"` // exact, without the query
	// Nth lists which of the matching requests (1-based, counted across the
	// Set's proxies) get the fault; empty means all of them.
	Nth        []int  `json:"nth,omitempty"`
	Fault      string `json:"fault"`
	Status     int    `json:"status,omitempty"`
	Code       string `json:"code,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	DelayMs    int    `json:"delay_ms,omitempty"`
}

// Record is one request a proxy received.
type Record struct {
	Proxy  int
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time
	Fault  string // the fault injected, "" if forwarded untouched
}

// Set holds the rules and records shared by a group of proxies.
type Set struct {
	// OnKill is called (synchronously) by a Kill fault with the index of
	// the proxy that received the request.
	OnKill func(proxy int)

	mu      sync.Mutex
	rules   []Rule
	counts  []int
	records []Record
}

// Reset replaces the rules and forgets the records and counts.
func (s *Set) Reset(rules []Rule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules, s.counts, s.records = rules, make([]int, len(rules)), nil
}

// Records returns the requests received since the last Reset, in arrival order.
func (s *Set) Records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.records)
}

// match records r and returns the fault to inject, if any. Every rule that
// matches counts the request; the first whose Nth includes its count wins.
func (s *Set) match(proxy int, r *http.Request, body []byte) *Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	var hit *Rule
	for i := range s.rules {
		rl := &s.rules[i]
		if rl.Method != r.Method || rl.Path != r.URL.Path {
			continue
		}
		s.counts[i]++
		if hit == nil && (len(rl.Nth) == 0 || slices.Contains(rl.Nth, s.counts[i])) {
			hit = rl
		}
	}
	rec := Record{Proxy: proxy, Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()}
	if hit != nil {
		rec.Fault = hit.Fault
	}
	s.records = append(s.records, rec)
	return hit
}

// Proxy listens on one loopback port and forwards to one node.
type Proxy struct {
	idx     int
	addr    string
	backend string
	set     *Set
	fwd     *http.Client

	mu  sync.Mutex
	srv *http.Server
}

// New starts proxy number idx of set on a free loopback port, forwarding to
// the node at backend (a base URL such as http://127.0.0.1:7070).
func New(set *Set, idx int, backend string) (*Proxy, error) {
	p := &Proxy{idx: idx, backend: backend, set: set,
		fwd: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 16}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	return p, nil
}

// URL is the proxy's base URL, to give a client as a server.
func (p *Proxy) URL() string { return "http://" + p.addr }

func (p *Proxy) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(p.handle), ReadHeaderTimeout: 10 * time.Second}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// Down closes the listener and every connection: the node looks dead
// (connections refused) until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Up listens again on the same address after Down.
func (p *Proxy) Up() error {
	p.mu.Lock()
	up := p.srv != nil
	p.mu.Unlock()
	if up {
		return nil
	}
	var ln net.Listener
	var err error
	for range 50 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("faultproxy: listening again on %s: %w", p.addr, err)
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.Down()
	p.fwd.CloseIdleConnections()
}

func (p *Proxy) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	rule := p.set.match(p.idx, r, body)
	if rule == nil {
		p.forward(w, r, body, false)
		return
	}
	switch rule.Fault {
	case Respond:
		if rule.RetryAfter != "" {
			w.Header().Set("Retry-After", rule.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rule.Status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
			"code": rule.Code, "message": "injected by the conformance suite's fault proxy"}})
	case Reset:
		resetConn(w)
	case DropAnswer:
		p.forward(w, r, body, true)
	case Delay:
		select {
		case <-time.After(time.Duration(rule.DelayMs) * time.Millisecond):
			p.forward(w, r, body, false)
		case <-r.Context().Done():
		}
	case Kill:
		if p.set.OnKill != nil {
			p.set.OnKill(p.idx)
		}
		resetConn(w)
	default:
		http.Error(w, "faultproxy: unknown fault "+rule.Fault, http.StatusInternalServerError)
	}
}

// forward sends the request to the node and copies its answer back, or,
// with drop, reads the whole answer and resets the client's connection.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, body []byte, drop bool) {
	ctx := r.Context()
	if drop { // the node must finish even when the client gives up first
		ctx = context.WithoutCancel(ctx)
	}
	u := p.backend + r.URL.Path
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header = r.Header.Clone()
	req.Header.Del("Connection")
	resp, err := p.fwd.Do(req)
	if err != nil { // the node is gone: so is the answer
		resetConn(w)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if drop || err != nil {
		resetConn(w)
		return
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(data)
}

// resetConn aborts the client's connection (RST) without an answer.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
