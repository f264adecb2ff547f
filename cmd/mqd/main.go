// Command mqd is a durable, replicated message queue broker with built-in
// idempotency, served over HTTP, and its own command-line client. See README.md.
//
// `mqd` or `mqd serve` runs the server; `mqd COMMAND ...` runs a client
// command against --server (see cli.go for the command table).
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

// dispatch picks the server, a client command, help or the version.
func dispatch(args []string) int {
	switch {
	case len(args) == 0 || args[0] == "serve":
		return serve(args)
	case args[0] == "--version" || args[0] == "-version" || args[0] == "version":
		printVersion(os.Stdout)
		return 0
	case args[0] == "--help" || args[0] == "-help" || args[0] == "-h" || args[0] == "help":
		mainUsage(os.Stdout)
		fmt.Fprintln(os.Stdout, "\nServer flags (mqd [serve] ...):")
		printFlags(os.Stdout, serverFlags(&options{}))
		return 0
	case isCommand(args):
		return runCommand(args)
	case isCommand(hoistClientFlags(args)):
		return runCommand(hoistClientFlags(args))
	case strings.HasPrefix(args[0], "-"):
		return serve(args)
	}
	fmt.Fprintf(os.Stderr, "mqd: unknown command %q (mqd --help lists them)\n", args[0])
	return 2
}
