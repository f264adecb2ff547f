package api

import (
	"errors"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestLimiters(t *testing.T) {
	l := newLimiters(RateLimits{PerToken: 2, PerConnection: 1})
	a, b := &net.TCPConn{}, &net.UDPConn{}
	if err := l.connection(a); err != nil {
		t.Fatal(err)
	}
	err := l.connection(a)
	if !errors.Is(err, ErrRateLimited) {
		t.Fatalf("second request at 1/s: %v", err)
	}
	if v, ok := retryAfter(err); !ok || v != "1" {
		t.Fatalf("Retry-After %q %v", v, ok)
	}
	if classify(err).status != 429 {
		t.Fatalf("status %d", classify(err).status)
	}
	if err := l.connection(b); err != nil {
		t.Fatalf("another connection: %v", err)
	}
	l.connState(a, fasthttp.StateClosed)
	l.connState(b, fasthttp.StateHijacked)
	if len(l.conns) != 0 {
		t.Fatalf("%d buckets left after the connections closed", len(l.conns))
	}
	for range 2 {
		if err := l.token("x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.token("x"); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("third request at 2/s: %v", err)
	}
	if err := l.token("y"); err != nil {
		t.Fatalf("another token: %v", err)
	}
	off := newLimiters(RateLimits{})
	for range 100 {
		if off.connection(a) != nil || off.token("x") != nil {
			t.Fatal("limits of 0 limit")
		}
	}
}
