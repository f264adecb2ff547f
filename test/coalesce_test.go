package test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// With --forward-coalesce (the default), publishes through a follower reach the leader
// as commands in its internal requests, answered as before: 201 with a
// place, 200 for a repeated key, 403 for a token without publish (on the
// follower), and every message stored once (the leader counts them).
func TestCoalescedForwardThroughFollower(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, systest.AuthRoles)
	c := tc.StartAuth(t, 3, fx)
	ctx := tc.CtxFor(t, 60*time.Second)
	leader, followers := tc.MustRoles(t, c)
	tc.MustTopic(t, leader, "orders", nil)
	coalescedPublishes(ctx, t, fx, followers[0], leader, "orders", 40)
}

// With --data-groups, a publish to a data group's topic through a
// member of the group that does not lead it goes coalesced to the group's
// leader (which need not lead the default group), answered and counted as
// through a follower of the default group.
func TestCoalescedForwardDataGroup(t *testing.T) {
	t.Parallel()
	fx := tc.AuthTokens(t, systest.AuthRoles)
	c := tc.StartAuth(t, 3, fx, tc.WithFlags("--data-groups"))
	ctx := tc.CtxFor(t, 90*time.Second)
	metaLeader, followers := tc.MustRoles(t, c)
	const tp = "orders-dg"
	tc.MustTopic(t, metaLeader, tp, nil)
	// Wait until the group is led by its preferred leader (the first of its
	// replicas), to which it is handed soon after its creation.
	var group, leaderID string
	for {
		g, l, reps, err := systest.TopicPlacement(ctx, metaLeader, tp)
		if err == nil && g != "" && len(reps) == 3 && l == reps[0] {
			group, leaderID = g, l
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s: placement %q led by %q of %v (%v), want a group led by its first replica", tp, g, l, reps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader := c.NodeByID(leaderID)
	// The entry is a member that does not lead the group: the metadata
	// leader when it does not lead it too.
	entry := metaLeader
	if entry == leader {
		entry = followers[0]
		if entry == leader {
			entry = followers[1]
		}
	}
	t.Logf("group %s of %s led by %s, the metadata group by %s; publishing through %s", group, tp, leader, metaLeader, entry)
	coalescedPublishes(ctx, t, fx, entry, leader, tp, 40)
}

// coalescedPublishes publishes n keyed messages to topic (which the token
// "pub" may publish to) concurrently through entry, a node that does not
// lead the topic's group, then one repeat and one publish with a token
// without the permission, and checks the answers, that entry sent the n+1
// allowed ones coalesced and that leader stored n.
func coalescedPublishes(ctx context.Context, t *testing.T, fx *tc.AuthFixture, entry, leader *tc.Node, topic string, n int) {
	t.Helper()
	// Until entry has applied the topic it forwards publishes as HTTP
	// requests (it cannot place them): wait for it.
	for {
		r, err := entry.Do(ctx, http.MethodGet, "/v1/topics/"+topic+"?stale=ok", nil, nil)
		if err == nil && r.Status == 200 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never knew topic %s: %v %+v", entry, topic, err, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pub := tc.NewClient(15*time.Second, 32).WithToken(fx.Secrets["pub"])
	url := entry.URL() + "/v1/topics/" + topic + "/messages"
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
		t.Errorf("repeated key through %s: %v", entry, err)
	}
	other := tc.NewClient(15*time.Second, 1).WithToken(fx.Secrets["other"])
	if r, err := other.Do(ctx, http.MethodPost, url, "x", nil); err != nil || r.Status != 403 {
		t.Errorf("publish without publish:%s through %s: %v %+v, want 403", topic, entry, err, r)
	}
	sent, err := systest.MetricSample(ctx, entry, "mqd_forward_coalesced_commands_total")
	if err != nil || sent != float64(n+1) {
		t.Errorf("%s sent %v coalesced commands (%v), want %d", entry, sent, err, n+1)
	}
	stored, ok := systest.MetricValue(systest.Scrape(ctx, t, leader), "mqd_published_messages_total", map[string]string{"topic": topic})
	if !ok || stored != float64(n) {
		t.Errorf("leader %s counts %v messages stored in %s (found: %v), want %d", leader, stored, topic, ok, n)
	}
}
