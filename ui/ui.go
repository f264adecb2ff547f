// Package ui holds mqd's web console: static HTML, CSS and JavaScript
// embedded in the binary, with no build step. The page talks to the same
// HTTP API as any client (package api serves these files at /ui); it holds
// no state of its own but the token the user pastes (in sessionStorage).
package ui

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files are the console's files: index.html, manage.js, app.js, style.css.
var Files = mustSub(static, "static")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // dir is a constant that exists
	}
	return sub
}
