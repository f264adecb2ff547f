package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client is a small HTTP client for JSON APIs with timeouts and keep-alive.
type Client struct {
	HTTP *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>" on every
	// request that does not set its own Authorization header.
	Token string
}

// WithToken returns a client that shares c's connections and sends token.
func (c *Client) WithToken(token string) *Client { return &Client{HTTP: c.HTTP, Token: token} }

// NewTLSClient is NewClient for HTTPS: it trusts the CA certificates in
// roots and, when cert is not nil, presents it as a client certificate
// (always, even when the server asks for another CA's).
func NewTLSClient(timeout time.Duration, maxIdlePerHost int, roots *x509.CertPool, cert *tls.Certificate) *Client {
	c := NewClient(timeout, maxIdlePerHost)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	c.HTTP.Transport.(*http.Transport).TLSClientConfig = cfg
	return c
}

// NewClient returns a Client whose requests time out after timeout in total
// and which keeps up to maxIdlePerHost idle connections per node.
func NewClient(timeout time.Duration, maxIdlePerHost int) *Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          4 * maxIdlePerHost,
		MaxIdleConnsPerHost:   maxIdlePerHost,
		IdleConnTimeout:       60 * time.Second,
		ResponseHeaderTimeout: timeout,
		DisableCompression:    true,
	}
	return &Client{HTTP: &http.Client{Transport: tr, Timeout: timeout}}
}

// DefaultClient has a 15 s timeout (above the broker's 10 s default deadline)
// and keeps 64 idle connections per host.
var DefaultClient = NewClient(15*time.Second, 64)

// Response is a fully read HTTP answer.
type Response struct {
	Method, URL string
	Status      int
	Body        []byte
	Header      http.Header
	Elapsed     time.Duration
}

// JSON decodes the body into v.
func (r *Response) JSON(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("%s %s: decoding %q: %w", r.Method, r.URL, truncate(r.Body, 300), err)
	}
	return nil
}

// Expect returns a *StatusError unless the status is one of want.
func (r *Response) Expect(want ...int) error {
	for _, w := range want {
		if r.Status == w {
			return nil
		}
	}
	e := &StatusError{Method: r.Method, URL: r.URL, Status: r.Status, Body: string(r.Body)}
	var eb ErrorBody
	if json.Unmarshal(r.Body, &eb) == nil && eb.Error != nil {
		e.Code = eb.Error.Code
	}
	return e
}

// CheckError checks that the body is {"error":{"code":"..","message":".."}}
// with a non-empty code and message, and returns the code.
func (r *Response) CheckError() (string, error) {
	var eb ErrorBody
	if err := json.Unmarshal(r.Body, &eb); err != nil {
		return "", fmt.Errorf("error body is not JSON: %q", truncate(r.Body, 300))
	}
	if eb.Error == nil || eb.Error.Code == "" || eb.Error.Message == "" {
		return "", fmt.Errorf("error body lacks error.code or error.message: %q", truncate(r.Body, 300))
	}
	return eb.Error.Code, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Do sends a request and reads the whole answer. body may be nil, []byte or
// string (sent as is), or anything else (sent as JSON). An error means no
// answer arrived (connection refused, timeout, ...).
func (c *Client) Do(ctx context.Context, method, url string, body any, hdr map[string]string) (*Response, error) {
	h := http.Header{}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return c.DoHeader(ctx, method, url, body, h)
}

// DoHeader is Do with the request headers as an http.Header, so that a
// header can be sent more than once.
func (c *Client) DoHeader(ctx context.Context, method, url string, body any, hdr http.Header) (*Response, error) {
	var rd io.Reader
	isJSON := false
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = bytes.NewReader([]byte(b))
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(buf)
		isJSON = true
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if isJSON {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" && hdr.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	start := time.Now()
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading body: %w", method, url, err)
	}
	return &Response{Method: method, URL: url, Status: resp.StatusCode, Body: data,
		Header: resp.Header, Elapsed: time.Since(start)}, nil
}
