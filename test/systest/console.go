package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium finds a Chromium to drive. Without one the test skips, unless
// CI is set: there a missing browser is a failure (.ci/run installs it).
func Chromium(t *testing.T) string {
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

// Browser starts a headless Chromium with a fresh profile; it ends with
// the test.
func Browser(t *testing.T, exe string, timeout time.Duration) context.Context {
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

// pageProblems collects the page's uncaught exceptions and Content
// Security Policy violations.
type pageProblems struct {
	stop func()
	done chan struct{}
	mu   sync.Mutex
	list []string
}

func WatchConsole(t *testing.T, b context.Context) *pageProblems {
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

func (p *pageProblems) Check(t *testing.T) {
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

// TextOf reads an element's text in one step (the page redraws its
// tables; a query and a later read could see two different rows).
func TextOf(t *testing.T, b context.Context, sel string) string {
	t.Helper()
	q, err := json.Marshal(sel)
	if err != nil {
		t.Fatal(err)
	}
	return MustRun(t, b, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%s) || {}).innerText || ""`, q)))
}

// MustRun runs one browser action and returns its value.
func MustRun[T any](t *testing.T, b context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// Screenshot saves the page into the test's temp dir (and into
// $MQD_TEST_SCREENSHOT_DIR when set, to look at it after the test).
func Screenshot(t *testing.T, b context.Context) {
	t.Helper()
	png := MustRun(t, b, chromedp.FullScreenshot(100)) // 100: PNG, below: JPEG
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

// WaitText waits (bounded) until sel's text contains want.
func WaitText(t *testing.T, b context.Context, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s := TextOf(t, b, sel); !strings.Contains(s, want); s = TextOf(t, b, sel) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q, want it to contain %q", sel, s, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
