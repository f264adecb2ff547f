package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The console's files are served with their types and the headers that
// keep the page to itself; anything else under /ui/ is a 404.
func TestConsoleFiles(t *testing.T) {
	rt := mustRouter(t)
	s := &Server{core: &core{}}
	for _, c := range []struct {
		path, ctype, contains string
	}{
		{"/ui", "text/html; charset=utf-8", `<script src="/ui/app.js"`},
		{"/ui/", "text/html; charset=utf-8", `<script src="/ui/app.js"`},
		{"/ui/index.html", "text/html; charset=utf-8", "<title>mqd console</title>"},
		{"/ui/app.js", "text/javascript; charset=utf-8", "sessionStorage"},
		{"/ui/style.css", "text/css; charset=utf-8", "--accent"},
	} {
		var r route
		if err := rt.match([]byte("GET"), c.path, &r); err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		var ctx fasthttp.RequestCtx
		if err := s.console(&ctx, &r); err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		h := &ctx.Response.Header
		if ct := string(h.ContentType()); ct != c.ctype {
			t.Errorf("%s: Content-Type %q, want %q", c.path, ct, c.ctype)
		}
		if !strings.Contains(string(ctx.Response.Body()), c.contains) {
			t.Errorf("%s: body lacks %q", c.path, c.contains)
		}
		if csp := string(h.Peek("Content-Security-Policy")); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", c.path, csp)
		}
	}
	for _, p := range []string{"/ui/nope.js", "/ui/../ui.go", "/ui/static/index.html", "/ui//app.js", "/ui/a/../app.js"} {
		var r route
		if err := rt.match([]byte("GET"), p, &r); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		var ctx fasthttp.RequestCtx
		if err := s.console(&ctx, &r); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", p, err)
		}
	}
}
