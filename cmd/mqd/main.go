// Command mqd is a durable, replicated message queue broker with built-in
// idempotency, served over HTTP, and its own command-line client. See README.md.
//
// `mqd` or `mqd serve` runs the server; `mqd COMMAND ...` runs a client
// command against --server.
package main

import (
	"os"
	"strings"
)

func main() {
	args := os.Args[1:]
	if len(args) == 0 || args[0] == "serve" || strings.HasPrefix(args[0], "-") {
		os.Exit(serve(args))
	}
	if args[0] == "token" {
		os.Exit(tokenCmd(args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(serve(args)) // client commands are dispatched here
}
