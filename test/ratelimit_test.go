package test

import (
	"strconv"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// burst sends n requests on cl (one keep-alive connection) and returns
// the 429s' largest Retry-After and how many there were.
func burst(t *testing.T, cl *tc.Client, url string, n int) (limited, retryAfter int) {
	t.Helper()
	for range n {
		r, err := cl.Do(tc.CtxFor(t, 10*time.Second), "GET", url, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch r.Status {
		case 200:
		case 429:
			limited++
			if code, err := r.CheckError(); err != nil || code != "rate_limited" {
				t.Fatalf("429: code %q (%v)", code, err)
			}
			ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("429 with Retry-After %q", r.Header.Get("Retry-After"))
			}
			retryAfter = max(retryAfter, ra)
		default:
			t.Fatalf("GET %s: %d %s", url, r.Status, r.Body)
		}
	}
	return limited, retryAfter
}

// waitServed polls (bounded by the Retry-After it was given, plus slack)
// until cl is served again.
func waitServed(t *testing.T, cl *tc.Client, url string, retryAfter int) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(retryAfter)*time.Second + 2*time.Second)
	time.Sleep(time.Duration(retryAfter) * time.Second)
	for {
		r, err := cl.Do(tc.CtxFor(t, 10*time.Second), "GET", url, nil, nil)
		if err == nil && r.Status == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served %ds after a 429 with Retry-After %d", retryAfter+2, retryAfter)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRateLimitPerConnection: a connection over --rate-per-connection gets
// 429 with Retry-After while another connection is served, and is served
// again after waiting.
func TestRateLimitPerConnection(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1, tc.WithFlags("--rate-per-connection", "20"))
	n := c.Node(0)
	url := n.URL() + "/healthz"
	greedy := tc.NewClient(10*time.Second, 1)
	limited, ra := burst(t, greedy, url, 100)
	if limited < 50 {
		t.Fatalf("%d of 100 back-to-back requests limited at 20/s, want most", limited)
	}
	// Another connection is not held back by the greedy one.
	if l, _ := burst(t, tc.NewClient(10*time.Second, 1), url, 5); l != 0 {
		t.Fatalf("a fresh connection got %d 429s", l)
	}
	waitServed(t, greedy, url, ra)
}

// TestRateLimitPerToken: a token over --rate-per-token is limited across
// all its connections, other tokens are not; it recovers.
func TestRateLimitPerToken(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, map[string][]string{"ops": {"monitor", "admin:*"}, "node": {"cluster"}, "greedy": {"monitor"}, "calm": {"monitor"}})
	c := tc.StartAuth(t, 1, fx, tc.WithFlags("--rate-per-token", "20", "--rate-per-connection", "0"))
	url := c.Node(0).URL() + "/v1/cluster"
	limited, ra := 0, 0
	for range 10 { // ten connections, ten requests each
		l, r := burst(t, tc.NewClient(10*time.Second, 1).WithToken(fx.Secrets["greedy"]), url, 10)
		limited, ra = limited+l, max(ra, r)
	}
	if limited < 50 {
		t.Fatalf("%d of 100 requests of one token limited at 20/s, want most", limited)
	}
	if l, _ := burst(t, tc.NewClient(10*time.Second, 1).WithToken(fx.Secrets["calm"]), url, 5); l != 0 {
		t.Fatalf("another token got %d 429s", l)
	}
	waitServed(t, tc.NewClient(10*time.Second, 1).WithToken(fx.Secrets["greedy"]), url, ra)
}
