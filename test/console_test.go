package test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium finds a Chromium to drive. Without one the test skips, unless
// CI is set: there a missing browser is a failure (.ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatal("CI is set and no chromium is installed (apt-get install -y chromium; .ci/run does it)")
	}
	t.Skip("skipped: no chromium on PATH (apt-get install -y chromium); with CI=true this fails instead")
	return ""
}

// browser starts a headless Chromium with a fresh profile; it ends with
// the test.
func browser(t *testing.T, exe string, timeout time.Duration) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1100),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser() // closes the browser
		cancelAlloc()   // and waits for its process
	})
	// The first action starts the browser, which lives as long as the
	// context of that action: no timeout on it, one on what follows.
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(bctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("start chromium %s: %v", exe, err)
		}
	case <-time.After(30 * time.Second):
		cancelBrowser()
		t.Fatalf("start chromium %s: no browser within 30 s (%v)", exe, <-done)
	}
	ctx, cancelTimeout := context.WithTimeout(bctx, timeout)
	t.Cleanup(cancelTimeout)
	return ctx
}

// TestConsole drives the web console in headless Chromium against a real
// node with auth on: the page asks for a token, lists a created topic,
// shows a dead letter with its failure history, a cancelled delete keeps
// it, and its replay button (after confirming) makes the message
// deliverable again.
func TestConsole(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	fx := authTokens(t, map[string][]string{
		"node":    {"cluster"},
		"ops":     {"monitor", "admin:*", "consume:*", "publish:*"}, // the harness's token
		"console": {"monitor", "admin:ui-*", "consume:ui-*"},        // the one pasted into the page
	})
	c := startAuthCluster(t, 1, fx)
	n := c.Node(0)
	ctx := ctxFor(t, 90*time.Second)
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

	mustTopic(t, n, topic, map[string]any{"partitions": 2})
	mustPublish(t, n, topic, payload, map[string]string{"Idempotency-Key": "order-42"})
	m, _ := rtFetchOne(t, n, topic, group, 10*time.Second, 60000)
	rtNack(t, n, topic, group, []string{m.Receipt}, map[string]any{"reason": reason, "retryable": false})
	rtWaitDLQ(t, n, topic, group, 1, 10*time.Second)

	start := time.Now()
	b := browser(t, exe, 75*time.Second)
	t.Logf("chromium started in %v", time.Since(start).Round(time.Millisecond))
	problems := watchConsole(t, b)
	defer problems.check(t)
	row := `#dlq-table tr[data-dlq-id="1"]`
	// Without a token the API answers 401 and the page asks for one.
	if err := chromedp.Do(b, chromedp.Navigate(n.URL()+"/ui"), chromedp.WaitVisible(`#banner`)); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	bannerText := mustRun(t, b, chromedp.Text(`#banner`))
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
	if stored := mustRun(t, b, chromedp.Evaluate[string](`sessionStorage.getItem("mqd-token")`)); stored != fx.Secrets["console"] {
		t.Errorf("sessionStorage holds %q, want the pasted token", stored)
	}
	topicRow := textOf(t, b, `#topic-table tr[data-topic="`+topic+`"]`)
	letter := textOf(t, b, row)
	for _, want := range []string{"order-42", payload, reason, "rejected"} {
		if !strings.Contains(letter, want) {
			t.Errorf("dead-letter row %q lacks %q", letter, want)
		}
	}
	if f := strings.Fields(topicRow); len(f) < 3 || f[0] != topic || f[1] != "2" || f[2] != "1" {
		t.Errorf("topic row %q, want %s with 2 partitions and 1 message", topicRow, topic)
	}
	screenshot(t, b)

	// The address names the view: closing the dead letters drops the group
	// from it, and going to the group's link opens them again.
	link := mustRun(t, b, chromedp.Evaluate[string](`document.querySelector('#group-table tr[data-group="`+group+`"] a.name').getAttribute("href")`))
	if want := "#topic=" + topic + "&group=" + group; link != want {
		t.Errorf("the group's link: %q, want %q", link, want)
	}
	if err := chromedp.Do(b, chromedp.Click(`#dlq-close`), chromedp.WaitNotVisible(`#dlq`)); err != nil {
		t.Fatalf("close the dead letters: %v", err)
	}
	if h := mustRun(t, b, chromedp.Evaluate[string](`location.hash`)); h != "#topic="+topic {
		t.Errorf("address with the dead letters closed: %q", h)
	}
	mustRun(t, b, chromedp.Evaluate[bool](`location.hash = `+strconv.Quote(link)+`; true`))
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
	if got := rtMustListDLQ(t, n, topic, group, ""); len(got.DeadLetters) != 1 {
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
	bannerText = mustRun(t, b, chromedp.Text(`#banner`))
	if !strings.Contains(bannerText, "Replay of dead letter 1 accepted (1)") {
		t.Errorf("banner after replay: %q", bannerText)
	}
	got, _ := rtFetchOne(t, n, topic, group, 15*time.Second, 60000)
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
	if s := textOf(t, b, rate); s != "0.0/s" {
		t.Errorf("publish rate with nothing published: %q, want 0.0/s", s)
	}
	for i := range 20 {
		mustPublish(t, n, topic, fmt.Sprintf("rate %d", i), nil)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s := ""; ; s = textOf(t, b, rate) {
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
	before := mustRun(t, b, chromedp.Text(`#updated`))
	deadline := time.Now().Add(15 * time.Second)
	for mustRun(t, b, chromedp.Text(`#updated`)) == before {
		if time.Now().After(deadline) {
			t.Fatalf("the page did not refresh within 15 s (still %q)", before)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pageProblems collects the page's uncaught exceptions and Content
// Security Policy violations.
type pageProblems struct {
	stop func()
	done chan struct{}
	mu   sync.Mutex
	list []string
}

func watchConsole(t *testing.T, b context.Context) *pageProblems {
	t.Helper()
	ctx, stop := context.WithCancel(b)
	p := &pageProblems{stop: stop, done: make(chan struct{})}
	msgs := chromedp.Console(ctx) // subscribed from here on
	go func() {
		defer close(p.done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
				p.mu.Lock()
				p.list = append(p.list, m.String())
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(stop)
	return p
}

func (p *pageProblems) check(t *testing.T) {
	t.Helper()
	p.stop()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Error("the console watcher did not stop within 10 s")
		return
	}
	for _, m := range p.list {
		t.Errorf("the page reported: %s", m)
	}
}

// textOf reads an element's text in one step (the page redraws its
// tables; a query and a later read could see two different rows).
func textOf(t *testing.T, b context.Context, sel string) string {
	t.Helper()
	q, err := json.Marshal(sel)
	if err != nil {
		t.Fatal(err)
	}
	return mustRun(t, b, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%s) || {}).innerText || ""`, q)))
}

// mustRun runs one browser action and returns its value.
func mustRun[T any](t *testing.T, b context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// screenshot saves the page into the test's temp dir (and into
// $MQD_TEST_SCREENSHOT_DIR when set, to look at it after the test).
func screenshot(t *testing.T, b context.Context) {
	t.Helper()
	png := mustRun(t, b, chromedp.FullScreenshot(100)) // 100: PNG, below: JPEG
	dirs := []string{t.TempDir()}
	if d := os.Getenv("MQD_TEST_SCREENSHOT_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(d, fmt.Sprintf("%s.png", t.Name()))
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", p, len(png))
	}
}
