package test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// With --forward-coalesce, publishes through a follower reach the leader
// as commands in its internal requests, answered as before: 201 with a
// place, 200 for a repeated key, 403 for a token without publish (on the
// follower), and every message stored once (the leader counts them).
func TestCoalescedForwardThroughFollower(t *testing.T) {
	t.Parallel()
	fx := authTokens(t, authRoles)
	c := startAuthCluster(t, 3, fx, tc.WithFlags("--forward-coalesce"))
	ctx := ctxFor(t, 60*time.Second)
	leader, followers := mustRoles(t, c)
	mustTopic(t, leader, "orders", nil)
	// Until the follower has applied the topic it forwards publishes as
	// HTTP requests (it cannot place them): wait for it.
	for {
		r, err := followers[0].Do(ctx, http.MethodGet, "/v1/topics/orders?stale=ok", nil, nil)
		if err == nil && r.Status == 200 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("follower never knew topic orders: %v %+v", err, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pub := tc.NewClient(15*time.Second, 32).WithToken(fx.Secrets["pub"])
	url := followers[0].URL() + "/v1/topics/orders/messages"
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := pub.Do(ctx, http.MethodPost, url, fmt.Sprintf("m%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("k%d", i)})
			if err == nil {
				err = r.Expect(201)
			}
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	r, err := pub.Do(ctx, http.MethodPost, url, "m3", map[string]string{"Idempotency-Key": "k3"})
	if err == nil {
		err = r.Expect(200)
	}
	if err != nil {
		t.Errorf("repeated key through the follower: %v", err)
	}
	other := tc.NewClient(15*time.Second, 1).WithToken(fx.Secrets["other"])
	if r, err := other.Do(ctx, http.MethodPost, url, "x", nil); err != nil || r.Status != 403 {
		t.Errorf("publish without publish:orders through the follower: %v %+v, want 403", err, r)
	}
	sent, err := metricSample(ctx, followers[0], "mqd_forward_coalesced_commands_total")
	if err != nil || sent != n+1 {
		t.Errorf("follower sent %v coalesced commands (%v), want %d", sent, err, n+1)
	}
	stored, err := metricSample(ctx, leader, `mqd_published_messages_total{topic="orders"}`)
	if err != nil || stored != n {
		t.Errorf("leader counts %v messages stored (%v), want %d", stored, err, n)
	}
}
