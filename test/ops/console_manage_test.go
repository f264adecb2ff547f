package ops

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// TestConsoleManages drives the console's management half in headless
// Chromium against a node with auth on: a token without admin gets the
// 403's message when it creates a topic (and nothing is created); with
// admin the page creates a topic, publishes a message, browses the
// topic's messages page by page (creating no group), draws its publish
// rate as an SVG line and shows the node's resources, then deletes the
// topic. On 1b577be the page has none of these forms, tables or charts.
func TestConsoleManages(t *testing.T) {
	t.Parallel()
	exe := systest.Chromium(t)
	fx := tc.AuthTokens(t, map[string][]string{
		"node":    {"cluster"},
		"ops":     {"monitor", "admin:*", "consume:*", "publish:*"},
		"console": {"monitor", "admin:ui-*", "consume:ui-*", "publish:ui-*"},
		"viewer":  {"monitor", "consume:ui-*"},
	})
	c := tc.StartAuth(t, 1, fx)
	n := c.Node(0)
	const topic = "ui-jobs"
	b := systest.Browser(t, exe, 100*time.Second)
	problems := systest.WatchConsole(t, b)
	defer problems.Check(t)

	useToken := func(name string) {
		t.Helper()
		setValue(t, b, `#token`, fx.Secrets[name])
		err := chromedp.Do(b, chromedp.Click(`#token-save`))
		if err != nil {
			t.Fatalf("use token %s: %v", name, err)
		}
	}
	saveTopic := func(partitions string) {
		t.Helper()
		setValue(t, b, `#tf-name`, topic)
		setValue(t, b, `#tf-partitions`, partitions)
		err := chromedp.Do(b, chromedp.Click(`#tf-save`))
		if err != nil {
			t.Fatalf("save topic: %v", err)
		}
	}
	if err := chromedp.Do(b, chromedp.Navigate(n.URL()+"/ui"), chromedp.WaitVisible(`#banner`)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	// A token without admin: the 403's message, and no topic.
	useToken("viewer")
	if err := chromedp.Do(b, chromedp.WaitVisible(`#nodes tbody tr`)); err != nil {
		t.Fatal(err)
	}
	saveTopic("2")
	systest.WaitText(t, b, `#banner`, "may not save topic "+topic)
	if r, err := n.Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/topics/"+topic, nil, nil); err != nil || r.Status != 404 {
		t.Fatalf("after a refused create: %v %v, want 404", r, err)
	}
	// The node's resources, from /v1/cluster.
	res := systest.TextOf(t, b, `#res-facts`)
	for _, want := range []string{"disk free", "open files / limit", "memory", "clock offset"} {
		if !strings.Contains(res, want) {
			t.Errorf("resources card %q lacks %q", res, want)
		}
	}

	useToken("console")
	saveTopic("2")
	systest.WaitText(t, b, `#banner`, "Topic "+topic+" saved (2 partitions)")
	row := `#topic-table tr[data-topic="` + topic + `"]`
	if err := chromedp.Do(b, chromedp.WaitVisible(row), chromedp.Click(row), chromedp.WaitVisible(`#publish-form`)); err != nil {
		t.Fatal(err)
	}
	setValue(t, b, `#pf-value`, "from the console")
	setValue(t, b, `#pf-key`, "c-1")
	if err := chromedp.Do(b, chromedp.Click(`#pf-send`)); err != nil {
		t.Fatal(err)
	}
	systest.WaitText(t, b, `#banner`, "Published to "+topic)
	for i := range 24 {
		tc.MustPublish(t, n, topic, fmt.Sprintf("api %d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("a-%d", i)})
	}
	// Browse: 20 a page, then the rest, every message once.
	seen := map[string]bool{}
	collect := func() int {
		rows := systest.MustRun(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#browse-table tbody tr")].map(r => r.dataset.pos + " " + r.innerText)`))
		for _, r := range rows {
			pos := strings.Fields(r)[0]
			if seen[pos] {
				t.Errorf("browse shows %s twice", pos)
			}
			seen[pos] = true
		}
		return len(rows)
	}
	if err := chromedp.Do(b, chromedp.Click(`#browse-load`), chromedp.WaitVisible(`#browse-table tbody tr`)); err != nil {
		t.Fatal(err)
	}
	waitRows(t, b, 20)
	if got := collect(); got != 20 {
		t.Errorf("first page: %d rows, want 20", got)
	}
	systest.Screenshot(t, b)
	for pages := 0; len(seen) < 25 && pages < 5; pages++ {
		before := systest.TextOf(t, b, `#browse-where`)
		if err := chromedp.Do(b, chromedp.Click(`#browse-next`)); err != nil {
			t.Fatal(err)
		}
		waitChange(t, b, `#browse-where`, before)
		collect()
	}
	if len(seen) != 25 {
		t.Errorf("browsed %d distinct messages, want 25: %v", len(seen), seen)
	}
	st, err := n.Stats(tc.CtxFor(t, 10*time.Second), topic)
	if err != nil || len(st.Groups) != 0 {
		t.Errorf("after browsing: groups %v (%v), want none", st.Groups, err)
	}
	// The publish rate is drawn from the page's samples.
	if err := chromedp.Do(b, chromedp.WaitVisible(`#chart-publish path.series[data-series="`+topic+`"]`)); err != nil {
		t.Errorf("no publish-rate line for %s: %v", topic, err)
	}
	systest.Screenshot(t, b)
	// Delete, confirmed.
	if err := chromedp.Do(b, chromedp.Click(`#topic-delete`), chromedp.WaitVisible(`#confirm`), chromedp.Click(`#confirm-ok`)); err != nil {
		t.Fatal(err)
	}
	systest.WaitText(t, b, `#banner`, "Topic "+topic+" deleted")
	if r, err := n.Do(tc.CtxFor(t, 10*time.Second), http.MethodGet, "/v1/topics/"+topic, nil, nil); err != nil || r.Status != 404 {
		t.Errorf("after the console's delete: %v %v, want 404", r, err)
	}
}

// TestConsoleQuorumLost opens the console on the one node left of three:
// the cluster card is drawn while the topic list still waits for a
// leader, then the page says there is no leader and shows the node's own
// state (?stale=ok): the topic and its messages. On 1b577be the cluster
// card waited for the topic list, which failed after 10 s with "the write
// could not be committed", and the page showed no topic.
func TestConsoleQuorumLost(t *testing.T) {
	t.Parallel()
	exe := systest.Chromium(t)
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	const topic = "ui-q"
	tc.MustTopic(t, l, topic, map[string]any{"partitions": 1})
	for i := range 3 {
		tc.MustPublish(t, l, topic, fmt.Sprintf("kept %d", i), nil)
	}
	tc.WaitApplied(t, c)
	s := fs[0]
	l.Kill()
	fs[1].Kill()
	b := systest.Browser(t, exe, 90*time.Second)
	problems := systest.WatchConsole(t, b)
	defer problems.Check(t)
	if err := chromedp.Do(b, chromedp.Navigate(s.URL()+"/ui#topic="+topic), chromedp.WaitVisible(`#nodes tbody tr`)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	// The topic list waits up to 3 s for a leader: the cluster card is
	// already drawn, and no verdict about the topics is shown yet.
	shown := systest.MustRun(t, b, chromedp.Evaluate[bool](`document.querySelector("#stale").hidden && document.querySelector("#banner").hidden`))
	if !shown {
		t.Errorf("when the cluster card appeared, a topics verdict was already shown: stale %q, banner %q",
			systest.TextOf(t, b, `#stale`), systest.TextOf(t, b, `#banner`))
	}
	if err := chromedp.Do(b, chromedp.WaitVisible(`#stale`), chromedp.WaitVisible(`#topic-table tr[data-topic="`+topic+`"]`),
		chromedp.WaitVisible(`#browse-table tbody tr`)); err != nil {
		t.Fatalf("the quorum-lost view: %v", err)
	}
	if s := systest.TextOf(t, b, `#stale`); !strings.Contains(s, "No leader") || !strings.Contains(s, "this node's own state") {
		t.Errorf("stale banner: %q", s)
	}
	waitRows(t, b, 3)
	if off := systest.MustRun(t, b, chromedp.Evaluate[bool](`document.querySelector("#tf-save").disabled && document.querySelector("#pf-send").disabled`)); !off {
		t.Error("without a leader the page still offers to save a topic and to publish")
	}
	if sum := systest.TextOf(t, b, `#node-summary`); !strings.Contains(sum, "leader none") {
		t.Errorf("node summary without a quorum: %q", sum)
	}
	systest.Screenshot(t, b)
}

// waitChange waits (bounded) until sel's text differs from before.
func waitChange(t *testing.T, b context.Context, sel, before string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for systest.TextOf(t, b, sel) == before {
		if time.Now().After(deadline) {
			t.Fatalf("%s still %q after 20 s", sel, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRows waits (bounded) until the browse table shows n rows.
func waitRows(t *testing.T, b context.Context, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := systest.MustRun(t, b, chromedp.Evaluate[int](`document.querySelectorAll("#browse-table tbody tr").length`))
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("browse table: %d rows after 20 s, want %d", got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setValue sets a form field's value as a person's typing would leave it.
func setValue(t *testing.T, b context.Context, sel, v string) {
	t.Helper()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; return true; })()`, sel, v)
	systest.MustRun(t, b, chromedp.Evaluate[bool](js))
}

// TestConsoleTracesKey: the topic page's trace box asks where the message
// with an idempotency key is (GET .../keys/{key}) and shows its position,
// the publishes answered as its duplicates and each group's state; a key
// the topic does not hold says so. On the code before, the page had no
// trace box.
func TestConsoleTracesKey(t *testing.T) {
	t.Parallel()
	exe := systest.Chromium(t)
	c := tc.Start(t, 1)
	n := tc.MustLeader(t, c)
	const topic = "ui-trace"
	tc.MustTopic(t, n, topic, map[string]any{"partitions": 2})
	for range 2 {
		tc.MustPublish(t, n, topic, "traced", map[string]string{"Idempotency-Key": "k-1"})
	}
	ctx := tc.CtxFor(t, 30*time.Second)
	msgs, _, err := n.Fetch(ctx, topic, "billing", tc.FetchRequest{Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("fetch: %v %v", msgs, err)
	}
	if _, _, err := n.Ack(ctx, topic, "billing", []string{msgs[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Fetch(ctx, topic, "audit", tc.FetchRequest{Max: 1}); err != nil { // leased, not acked
		t.Fatal(err)
	}
	b := systest.Browser(t, exe, 60*time.Second)
	problems := systest.WatchConsole(t, b)
	defer problems.Check(t)
	if err := chromedp.Do(b, chromedp.Navigate(n.URL()+"/ui#topic="+topic), chromedp.WaitVisible(`#trace-form`)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	setValue(t, b, `#trace-key`, "k-1")
	if err := chromedp.Do(b, chromedp.Click(`#trace-go`), chromedp.WaitVisible(`#trace-result`)); err != nil {
		t.Fatal(err)
	}
	where := systest.TextOf(t, b, `#trace-where`)
	if !strings.Contains(where, fmt.Sprintf("partition %d offset %d", msgs[0].Partition, msgs[0].Offset)) || !strings.Contains(where, "1 duplicate publish") {
		t.Errorf("trace of k-1: %q, want partition %d offset %d and 1 duplicate", where, msgs[0].Partition, msgs[0].Offset)
	}
	states := systest.MustRun(t, b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#trace-table tbody tr")].map(r => r.dataset.group + " " + r.cells[1].innerText + " " + r.cells[2].innerText)`))
	if want := []string{"audit leased 1", "billing acked 1"}; strings.Join(states, ",") != strings.Join(want, ",") {
		t.Errorf("groups of k-1: %q, want %q", states, want)
	}
	systest.Screenshot(t, b)
	setValue(t, b, `#trace-key`, "nope")
	if err := chromedp.Do(b, chromedp.Click(`#trace-go`)); err != nil {
		t.Fatal(err)
	}
	systest.WaitText(t, b, `#trace-where`, "No message with key nope")
}
