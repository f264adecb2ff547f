package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	DefaultServer       = "http://127.0.0.1:7070"
	DefaultTimeout      = 15 * time.Second // above the broker's 10 s commit deadline
	DefaultMaxAttempts  = 10
	DefaultRetryBackoff = 100 * time.Millisecond
	maxRetryBackoff     = 2 * time.Second
	maxErrorBody        = 64 << 10
)

// Config says where and how a Client talks to the broker. The zero value
// talks to DefaultServer.
type Config struct {
	// Servers are the nodes' base URLs ("http://10.0.0.1:7070",
	// "https://mq.example:7070"); a bare host:port means http://host:port.
	Servers []string
	// Token is sent as "Authorization: Bearer <Token>" when not empty.
	Token string
	// TLSCAFile names a PEM file of CA certificates trusted for https
	// servers (instead of the system's). RootCAs does the same in memory.
	TLSCAFile string
	RootCAs   *x509.CertPool
	// Timeout bounds one attempt of one request (default 15 s). A fetch
	// adds its wait to it, so a long poll is never cut off by it.
	Timeout time.Duration
	// MaxAttempts bounds the tries of one request (default 10), across nodes.
	MaxAttempts int
	// RetryBackoff is the pause after the first failed attempt (default
	// 100 ms), doubled after each further one up to 2 s; a Retry-After
	// header lengthens it.
	RetryBackoff time.Duration
	// HTTPClient replaces the client's own transport (then TLSCAFile,
	// RootCAs and Timeout are not applied to it).
	HTTPClient *http.Client
	// MaxIdleConnsPerHost for the client's own transport (default 64).
	MaxIdleConnsPerHost int
}

// Client talks to one mqd cluster. It is safe for concurrent use.
type Client struct {
	nodes       []string
	token       string
	http        *http.Client
	timeout     time.Duration
	maxAttempts int
	backoff     time.Duration
	cur         atomic.Uint32 // index of the node that answered last
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	c := &Client{token: cfg.Token, timeout: cfg.Timeout, maxAttempts: cfg.MaxAttempts, backoff: cfg.RetryBackoff}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxAttempts <= 0 {
		c.maxAttempts = DefaultMaxAttempts
	}
	if c.backoff <= 0 {
		c.backoff = DefaultRetryBackoff
	}
	servers := cfg.Servers
	if len(servers) == 0 {
		servers = []string{DefaultServer}
	}
	for _, s := range servers {
		u, err := normalize(s)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, u)
	}
	if c.http = cfg.HTTPClient; c.http == nil {
		tr, err := transport(cfg)
		if err != nil {
			return nil, err
		}
		c.http = &http.Client{Transport: tr}
	}
	return c, nil
}

// normalize turns "host:port" or a URL into a base URL without a trailing slash.
func normalize(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", ErrNoNodes
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("client: server %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("client: server %q: want http://host:port or https://host:port", s)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.Path, "/"), nil
}

func transport(cfg Config) (*http.Transport, error) {
	idle := cfg.MaxIdleConnsPerHost
	if idle <= 0 {
		idle = 64
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4 * idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
		DisableCompression:  true,
	}
	pool := cfg.RootCAs
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("client: --tls-ca: %w", err)
		}
		if pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client: --tls-ca %s: no PEM certificate in it", cfg.TLSCAFile)
		}
	}
	if pool != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return tr, nil
}

// Nodes returns the base URLs the client knows.
func (c *Client) Nodes() []string { return append([]string(nil), c.nodes...) }

// retryPolicy says when a request may be sent again.
type retryPolicy int

const (
	// retrySafe: the request changes nothing, or sending it twice does no
	// harm (reads, acks, a publish with an idempotency key).
	retrySafe retryPolicy = iota
	// retryUnsent: only when the request cannot have reached a node.
	retryUnsent
)

type request struct {
	method, path string
	query        url.Values
	body         []byte
	header       http.Header
	policy       retryPolicy
	extra        time.Duration // added to the per-attempt timeout (long polls)
}

// Response is a raw 2xx answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends r, moving to the next node and retrying as r.policy allows.
func (c *Client) do(ctx context.Context, r *request) (*Response, error) {
	backoff := c.backoff
	var last error
	for attempt := 1; ; attempt++ {
		idx := c.cur.Load()
		resp, err := c.once(ctx, c.nodes[int(idx)%len(c.nodes)], r)
		if err == nil {
			return resp, nil
		}
		last = err
		wait, ok := c.retryable(err, r.policy)
		if !ok || attempt >= c.maxAttempts || ctx.Err() != nil {
			return nil, last
		}
		// Move on to the next node, unless another request already did.
		if !broken(breakNoFailover) {
			c.cur.CompareAndSwap(idx, (idx+1)%uint32(len(c.nodes)))
		}
		if broken(breakIgnoreRetryAfter) {
			wait = 0
		}
		if broken(breakNewKey) && r.header.Get("Idempotency-Key") != "" {
			r.header.Set("Idempotency-Key", fmt.Sprintf("%s-retry%d", r.header.Get("Idempotency-Key"), attempt))
		}
		wait = max(wait, backoff)
		backoff = min(2*backoff, maxRetryBackoff)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, last
		case <-t.C:
		}
	}
}

// retryable says whether err may be retried under p, and how long the
// broker asked to wait.
func (c *Client) retryable(err error, p retryPolicy) (time.Duration, bool) {
	if broken(breakNoRetry) {
		return 0, false
	}
	var te *TransportError
	if errors.As(err, &te) {
		return 0, p == retrySafe || !te.Sent
	}
	var e *Error
	if errors.As(err, &e) && e.Retryable() && p == retrySafe {
		return min(e.RetryAfter, maxRetryBackoff), true
	}
	if e != nil && broken(breakRetry4xx) && e.Status < 500 {
		return 0, true
	}
	return 0, false
}

// once sends r to node and reads the answer.
func (c *Client) once(ctx context.Context, node string, r *request) (*Response, error) {
	extra := r.extra
	if broken(breakTimeoutNoWait) {
		extra = 0
	}
	actx, cancel := context.WithTimeout(ctx, c.timeout+extra)
	defer cancel()
	u := node + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(actx, r.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", r.method, r.path, ctx.Err())
		}
		return nil, &TransportError{Node: node, Sent: !isDialError(err), Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, &TransportError{Node: node, Sent: true, Err: fmt.Errorf("reading answer: %w", err)}
		}
		return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return nil, apiError(r, resp, data)
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func apiError(r *request, resp *http.Response, data []byte) *Error {
	e := &Error{Status: resp.StatusCode, Method: r.method, Path: r.path}
	var b struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &b) == nil && b.Error != nil {
		e.Code, e.Message = b.Error.Code, b.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(data))
		if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

// Do sends a request to the API as it is (path such as "/v1/cluster",
// body nil or JSON) and returns the 2xx answer raw. Reads (GET) are retried
// on other nodes; other methods only when they cannot have been sent.
func (c *Client) Do(ctx context.Context, method, path string, body []byte) (*Response, error) {
	p := retryUnsent
	if method == http.MethodGet {
		p = retrySafe
	}
	return c.do(ctx, &request{method: method, path: path, body: body, policy: p, header: jsonHeader(body)})
}

func jsonHeader(body []byte) http.Header {
	if body == nil {
		return nil
	}
	return http.Header{"Content-Type": {"application/json"}}
}

// call sends a JSON request (in may be nil) and decodes a JSON answer into
// out (may be nil); it returns the raw answer too.
func (c *Client) call(ctx context.Context, method, path string, in, out any, p retryPolicy, extra time.Duration) (*Response, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, fmt.Errorf("client: encoding request: %w", err)
		}
	}
	resp, err := c.do(ctx, &request{method: method, path: path, body: body, header: jsonHeader(body), policy: p, extra: extra})
	if err != nil {
		return nil, err
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body, out); err != nil {
			return resp, fmt.Errorf("client: %s %s: decoding answer: %w", method, path, err)
		}
	}
	return resp, nil
}

// esc escapes one path segment.
func esc(s string) string { return url.PathEscape(s) }
