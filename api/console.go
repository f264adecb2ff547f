package api

import (
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"path"

	"github.com/mqd/mqd/ui"
	"github.com/valyala/fasthttp"
)

// consoleCSP keeps the console's page to its own files: no inline script,
// no other origin, no framing (the page holds a token and has delete
// buttons).
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// consoleTypes fixes the types of the console's own files (the system's
// MIME table varies between machines).
var consoleTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

// console serves the web console's files; /ui and /ui/ are its page. The
// files are open: the page asks for a token and sends it on its API calls.
func (s *Server) console(ctx *fasthttp.RequestCtx, r *route) error {
	name := r.rest
	if name == "" {
		name = "index.html"
	}
	b, err := fs.ReadFile(ui.Files, name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("%w: no console file %q", ErrNotFound, name)
	}
	if err != nil {
		return fmt.Errorf("console file %q: %w", name, err)
	}
	ct, ok := consoleTypes[path.Ext(name)]
	if !ok {
		ct = mime.TypeByExtension(path.Ext(name))
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	h := &ctx.Response.Header
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	ctx.SetStatusCode(200)
	ctx.SetContentType(ct)
	ctx.SetBody(b)
	return nil
}
