package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// SIGTERM of the leader while 64 publishers with keep-alive connections
// publish to it (each message with an Idempotency-Key, retried with the
// same key): the leader hands leadership off first and forwards what
// arrives meanwhile, so no publisher sees anything but 2xx, a retryable
// 503 with Retry-After from another node (never from the stopping one:
// it forwards instead), or — once the listener is closed — connection
// refused, after which it goes to another node (the documented client
// behaviour). The process exits 0 well within 10 s, and every acknowledged
// message is delivered afterwards.
func TestGracefulStopOfLeaderUnderLoad(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	leader := tc.MustLeader(t, c)
	tc.MustTopic(t, leader, "graceful", map[string]any{"partitions": 3})
	nodes := c.Nodes()
	start := 0
	for i, n := range nodes {
		if n == leader {
			start = i
		}
	}
	var (
		mu         sync.Mutex
		acked      = map[string]bool{}
		outcomes   = map[string]int{}
		violations []string
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	note := func(outcome, violation string) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[outcome]++
		if violation != "" && len(violations) < 20 {
			violations = append(violations, violation)
		}
	}
	for p := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := tc.NewClient(8*time.Second, 2) // keep-alive, one connection in use
			target := start
			for i := 0; ; i++ {
				key := fmt.Sprintf("p%02d-%06d", p, i)
				for attempt := 0; ; attempt++ {
					select {
					case <-stop:
						return
					default:
					}
					if attempt > 200 {
						note("gave up", key+": no 2xx after 200 attempts")
						return
					}
					n := nodes[target%len(nodes)]
					ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
					r, err := client.Do(ctx, http.MethodPost, n.URL()+"/v1/topics/graceful/messages", key,
						map[string]string{"Idempotency-Key": key, "Mq-Timeout-Ms": "5000"})
					cancel()
					switch {
					case err != nil && errors.Is(err, syscall.ECONNREFUSED):
						note("connection refused", "")
						target++ // the listener is closed: another node
						continue
					case err != nil:
						note("transport error", fmt.Sprintf("%s via %s: %v", key, n, err))
						target++
						continue
					case r.Status == 201 || r.Status == 200:
						note(fmt.Sprint(r.Status), "")
						mu.Lock()
						acked[key] = true
						mu.Unlock()
					case r.Status == 503 && r.Header.Get("Retry-After") != "":
						code, _ := r.CheckError()
						v := ""
						if n == leader { // it should have forwarded it to the new leader
							v = fmt.Sprintf("%s via the stopping leader %s: 503 %s", key, n, r.Body)
						}
						note(fmt.Sprintf("503 %s from %s", code, n.ID()), v)
						time.Sleep(20 * time.Millisecond)
						continue
					default:
						note(fmt.Sprint(r.Status), fmt.Sprintf("%s via %s: %d %s", key, n, r.Status, r.Body))
						continue
					}
					break
				}
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitAcked := func(n int) {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			k := len(acked)
			mu.Unlock()
			if k >= n {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("publishers did not reach %d acknowledged", n)
	}
	waitAcked(1000)
	took, err := leader.StopWithin(10 * time.Second)
	if err != nil {
		t.Errorf("graceful stop of the leader: %v", err)
	}
	mu.Lock()
	atStop := len(acked)
	mu.Unlock()
	waitAcked(atStop + 1000) // the cluster goes on without it
	close(stop)
	wg.Wait()

	mu.Lock()
	var keys []string
	for k, v := range outcomes {
		keys = append(keys, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(keys)
	t.Logf("leader %s exited %v after SIGTERM; %d acknowledged; outcomes %v", leader.ID(), took.Round(time.Millisecond), len(acked), keys)
	if len(violations) > 0 {
		t.Errorf("answers other than 2xx, 503 with Retry-After (not from the stopping leader) or connection refused:\n%v", violations)
	}
	mu.Unlock()
	if took > 7*time.Second {
		t.Errorf("the leader took %v to exit after SIGTERM, want under 7 s", took)
	}
	var rest *tc.Node
	for _, n := range nodes {
		if n != leader {
			rest = n
		}
	}
	msgs, err := tc.Drain(tc.CtxFor(t, 120*time.Second), rest, "graceful", "g", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range msgs {
		got[m.IdempotencyKey] = true
	}
	lost := 0
	for k := range acked {
		if !got[k] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d acknowledged messages lost (of %d)", lost, len(acked))
	}
}
