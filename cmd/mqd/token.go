package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mqd/mqd/auth"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// tokenCmd runs `mqd token new --name N --permission P [--permission P ...]
// --auth-file PATH`: it adds a token to the file (creating it, mode 0600)
// and prints the secret once; the file keeps only its SHA-256.
func tokenCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "new" {
		fmt.Fprintln(stderr, "usage: mqd token new --name NAME --permission PERM [--permission PERM ...] --auth-file PATH")
		return 2
	}
	fs := flag.NewFlagSet("mqd token new", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // --help: printed once, to stdout, below
	name := fs.String("name", "", "the token's name (shown in logs and 403 messages)")
	path := fs.String("auth-file", os.Getenv("MQD_AUTH_FILE"), "token file to add it to (created if missing)")
	var perms stringList
	fs.Var(&perms, "permission", "publish:<glob>, consume:<glob>, admin:<glob>, cluster or monitor (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: mqd token new --name NAME --permission PERM [--permission PERM ...] --auth-file PATH\n\n%s\n\nFlags:\n",
				commands["token new"].summary)
			printFlags(stdout, fs)
			return 0
		}
		fmt.Fprintln(stderr, "usage: mqd token new --name NAME --permission PERM [--permission PERM ...] --auth-file PATH  (mqd token new --help)")
		return 2
	}
	if *name == "" || *path == "" || len(perms) == 0 || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "mqd token new: --name, --auth-file and at least one --permission are required")
		return 2
	}
	secret, err := auth.AddToken(*path, *name, perms)
	if err != nil {
		fmt.Fprintln(stderr, "mqd token new:", err)
		return 1
	}
	fmt.Fprintf(stderr, "token %q added to %s; the secret below is shown only now (send SIGHUP to running nodes to load it)\n", *name, *path)
	fmt.Fprintln(stdout, secret)
	return 0
}
