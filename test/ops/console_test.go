package ops

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestConsole drives the web console in headless Chromium against a real
// node with auth on: the page asks for a token, lists a created topic,
// shows a dead letter with its failure history, a cancelled delete keeps
// it, and its replay button (after confirming) makes the message
// deliverable again.
func TestConsole(t *testing.T) {
	t.Parallel()
	exe := systest.Chromium(t)
	fx := tc.AuthTokens(t, map[string][]string{
		"node":    {"cluster"},
		"ops":     {"monitor", "admin:*", "consume:*", "publish:*"}, // the harness's token
		"console": {"monitor", "admin:ui-*", "consume:ui-*"},        // the one pasted into the page
	})
	c := tc.StartAuth(t, 1, fx)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 90*time.Second)
	const topic, group, payload, reason = "ui-orders", "billing", "poison pill 42", "card declined: insufficient funds"

	// The API description is open, and YAML.
	r, err := n.DoHeader(ctx, http.MethodGet, "/v1/openapi.yaml", nil, http.Header{"Authorization": {"Bearer nope"}})
	if err != nil || r.Status != 200 || !strings.HasPrefix(string(r.Body), "openapi: 3.1.0") {
		t.Fatalf("GET /v1/openapi.yaml: %v %v", r, err)
	}

	// A known path with another method: 405 naming the allowed ones.
	r, err = n.Do(ctx, http.MethodPatch, "/ui", nil, nil)
	if err != nil {
		t.Fatalf("PATCH /ui: %v", err)
	}
	if r.Status != 405 || r.Header.Get("Allow") != "GET" {
		t.Errorf("PATCH /ui: %d, Allow %q, %s; want 405 with Allow: GET", r.Status, r.Header.Get("Allow"), r.Body)
	}

	tc.MustTopic(t, n, topic, map[string]any{"partitions": 2})
	tc.MustPublish(t, n, topic, payload, map[string]string{"Idempotency-Key": "order-42"})
	m, _ := systest.RtFetchOne(t, n, topic, group, 10*time.Second, 60000)
	systest.RtNack(t, n, topic, group, []string{m.Receipt}, map[string]any{"reason": reason, "retryable": false})
	systest.RtWaitDLQ(t, n, topic, group, 1, 10*time.Second)

	start := time.Now()
	b := systest.Browser(t, exe, 75*time.Second)
	t.Logf("chromium started in %v", time.Since(start).Round(time.Millisecond))
	problems := systest.WatchConsole(t, b)
	defer problems.Check(t)
	row := `#dlq-table tr[data-dlq-id="1"]`
	// Without a token the API answers 401 and the page asks for one.
	if err := chromedp.Do(b, chromedp.Navigate(n.URL()+"/ui"), chromedp.WaitVisible(`#banner`)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	bannerText := systest.MustRun(t, b, chromedp.Text(`#banner`))
	if !strings.Contains(bannerText, "requires a token") {
		t.Errorf("banner without a token: %q, want it to ask for one", bannerText)
	}
	err = chromedp.Do(b,
		chromedp.SendKeys(`#token`, fx.Secrets["console"]),
		chromedp.Click(`#token-save`),
		chromedp.WaitVisible(`#topic-table tr[data-topic="`+topic+`"]`),
		chromedp.Click(`#topic-table tr[data-topic="`+topic+`"]`),
		chromedp.WaitVisible(`#group-table tr[data-group="`+group+`"] button.show-dlq`),
		chromedp.Click(`#group-table tr[data-group="`+group+`"] button.show-dlq`),
		chromedp.WaitVisible(row),
		chromedp.Click(row+` details summary`),
		chromedp.WaitVisible(row+` .history li`),
	)
	if err != nil {
		t.Fatalf("find the dead letter in the console: %v", err)
	}
	if stored := systest.MustRun(t, b, chromedp.Evaluate[string](`sessionStorage.getItem("mqd-token")`)); stored != fx.Secrets["console"] {
		t.Errorf("sessionStorage holds %q, want the pasted token", stored)
	}
	topicRow := systest.TextOf(t, b, `#topic-table tr[data-topic="`+topic+`"]`)
	letter := systest.TextOf(t, b, row)
	for _, want := range []string{"order-42", payload, reason, "rejected"} {
		if !strings.Contains(letter, want) {
			t.Errorf("dead-letter row %q lacks %q", letter, want)
		}
	}
	if f := strings.Fields(topicRow); len(f) < 3 || f[0] != topic || f[1] != "2" || f[2] != "1" {
		t.Errorf("topic row %q, want %s with 2 partitions and 1 message", topicRow, topic)
	}
	systest.Screenshot(t, b)

	// The address names the view: closing the dead letters drops the group
	// from it, and going to the group's link opens them again.
	link := systest.MustRun(t, b, chromedp.Evaluate[string](`document.querySelector('#group-table tr[data-group="`+group+`"] a.name').getAttribute("href")`))
	if want := "#topic=" + topic + "&group=" + group; link != want {
		t.Errorf("the group's link: %q, want %q", link, want)
	}
	if err := chromedp.Do(b, chromedp.Click(`#dlq-close`), chromedp.WaitNotVisible(`#dlq`)); err != nil {
		t.Fatalf("close the dead letters: %v", err)
	}
	if h := systest.MustRun(t, b, chromedp.Evaluate[string](`location.hash`)); h != "#topic="+topic {
		t.Errorf("address with the dead letters closed: %q", h)
	}
	systest.MustRun(t, b, chromedp.Evaluate[bool](`location.hash = `+strconv.Quote(link)+`; true`))
	if err := chromedp.Do(b, chromedp.WaitVisible(row)); err != nil {
		t.Fatalf("reopen the dead letters by their address: %v", err)
	}

	// Delete, then cancel: the letter stays.
	if err := chromedp.Do(b,
		chromedp.Click(row+` button.delete`),
		chromedp.WaitVisible(`#confirm`),
		chromedp.Click(`#confirm-cancel`),
		chromedp.WaitNotVisible(`#confirm`),
	); err != nil {
		t.Fatalf("cancel a delete: %v", err)
	}
	// A delete the page sent would go out at once; two refreshes of the
	// page later it would be long answered.
	waitRefresh(t, b)
	waitRefresh(t, b)
	if got := systest.RtMustListDLQ(t, n, topic, group, ""); len(got.DeadLetters) != 1 {
		t.Fatalf("after a cancelled delete: %d dead letters, want 1", len(got.DeadLetters))
	}

	// Replay, confirmed: the message is deliverable again, the list empties.
	if err := chromedp.Do(b,
		chromedp.Click(row+` button.replay`),
		chromedp.WaitVisible(`#confirm`),
		chromedp.Click(`#confirm-ok`),
		chromedp.WaitVisible(`#banner.info`),
	); err != nil {
		t.Fatalf("replay from the console: %v", err)
	}
	bannerText = systest.MustRun(t, b, chromedp.Text(`#banner`))
	if !strings.Contains(bannerText, "Replay of dead letter 1 accepted (1)") {
		t.Errorf("banner after replay: %q", bannerText)
	}
	got, _ := systest.RtFetchOne(t, n, topic, group, 15*time.Second, 60000)
	v, err := base64.StdEncoding.DecodeString(got.ValueB64)
	if err != nil || string(v) != payload || got.RetryCount != 0 || got.IdempotencyKey != "order-42" {
		t.Errorf("after the console's replay fetch gave %q (retry_count %d, key %q), want %q with retry_count 0",
			v, got.RetryCount, got.IdempotencyKey, payload)
	}
	if err := chromedp.Do(b, chromedp.WaitVisible(`#no-dlq`)); err != nil {
		t.Errorf("the console still lists a dead letter after the replay: %v", err)
	}

	// The publish rate follows the offsets between two readings.
	rate := `#topic-table tr[data-topic="` + topic + `"] td.rate`
	if s := systest.TextOf(t, b, rate); s != "0.0/s" {
		t.Errorf("publish rate with nothing published: %q, want 0.0/s", s)
	}
	for i := range 20 {
		tc.MustPublish(t, n, topic, fmt.Sprintf("rate %d", i), nil)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s := ""; ; s = systest.TextOf(t, b, rate) {
		if s != "" && s != "0.0/s" {
			if !strings.HasSuffix(s, "/s") || !(s[0] >= '1' && s[0] <= '9' || strings.HasPrefix(s, "0.")) {
				t.Errorf("publish rate after 20 publishes: %q", s)
			}
			t.Logf("publish rate after 20 publishes: %s", s)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish rate still %q 15 s after 20 publishes", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRefresh returns when the page has refreshed its data once more.
func waitRefresh(t *testing.T, b context.Context) {
	t.Helper()
	before := systest.MustRun(t, b, chromedp.Text(`#updated`))
	deadline := time.Now().Add(15 * time.Second)
	for systest.MustRun(t, b, chromedp.Text(`#updated`)) == before {
		if time.Now().After(deadline) {
			t.Fatalf("the page did not refresh within 15 s (still %q)", before)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
