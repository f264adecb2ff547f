package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mqd/mqd/client"
)

// A command is one client command (`mqd topic create ...`). Each file
// registers its commands in an init function; `mqd --help` lists them in
// the order of cmdOrder, then by name.
type command struct {
	name    string // one or two words: "pub", "topic create"
	args    string // usage after the name and before the flags: "TOPIC [MESSAGE]"
	summary string
	// local commands do not talk to a server: they get no --server,
	// --token, --tls-ca flags and cli.client is nil.
	local bool
	// longRunning commands (sub, bench) retry a failed request as long as
	// the Go client does by default (10 attempts, about 11 s), riding out a
	// node's restart; the others give up after trying each server twice.
	longRunning bool
	// setup defines the command's flags on fs and returns what runs it
	// with the positional arguments.
	setup func(fs *flag.FlagSet) func(ctx context.Context, c *cli, args []string) error
	// raw, instead of setup, runs a command that parses its own flags.
	raw func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]*command{}

func init() {
	register(&command{name: "token new", args: "--name N --permission P... --auth-file F",
		summary: "add a token to an auth file and print its secret once (no server involved)", local: true,
		raw: func(args []string, stdout, stderr io.Writer) int {
			return tokenCmd(append([]string{"new"}, args...), stdout, stderr)
		}})
}

// cmdOrder is the order of the groups in `mqd --help`; others follow by name.
var cmdOrder = []string{"topic", "pub", "sub", "peek", "dlq", "cluster", "bench", "restore", "token"}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("mqd: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// cli is what a running command uses: its client and where to write.
type cli struct {
	client *client.Client
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// errUsage marks a command-line mistake (exit status 2).
var errUsage = errors.New("usage")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

// isCommand reports whether args start with a client command or group.
func isCommand(args []string) bool {
	if len(args) == 0 {
		return false
	}
	_, ok := commands[args[0]]
	return ok || len(group(args[0])) > 0
}

// group returns the commands named "word ...".
func group(word string) []*command {
	var out []*command
	for name, c := range commands {
		if strings.HasPrefix(name, word+" ") {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// runCommand runs the client command args name and returns the exit status.
func runCommand(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	return c.run(ctx, args)
}

func (c *cli) run(ctx context.Context, args []string) int {
	cmd, rest := lookup(args)
	if cmd == nil {
		if g := group(args[0]); len(g) > 0 {
			if len(args) > 1 && isHelp(args[1]) {
				fmt.Fprintf(c.stdout, "Commands of mqd %s (mqd %s COMMAND --help shows one's flags):\n", args[0], args[0])
				listCommands(c.stdout, g)
				return 0
			}
			if len(args) > 1 {
				fmt.Fprintf(c.stderr, "mqd: unknown command %q\n\n", args[0]+" "+args[1])
			}
			listCommands(c.stderr, g)
			return 2
		}
		fmt.Fprintf(c.stderr, "mqd: unknown command %q (mqd --help lists them)\n", args[0])
		return 2
	}
	if cmd.raw != nil {
		return cmd.raw(rest, c.stdout, c.stderr)
	}
	fs := flag.NewFlagSet("mqd "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	var g globalFlags
	if !cmd.local {
		g.define(fs)
		if !cmd.longRunning {
			fs.DurationVar(&g.timeout, "timeout", defaultCLITimeout, "give up after this long without an answer")
		}
	}
	runFn := cmd.setup(fs)
	usage := func() {
		fmt.Fprintf(c.stderr, "usage: mqd %s [flags]  (mqd %s --help)\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.name)
	}
	// On a flag error the flag package prints its message and calls
	// fs.Usage, on --help too: help goes to stdout, once, below.
	fs.Usage = func() {}
	pos, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		commandUsage(c.stdout, cmd, fs)
		return 0
	}
	if err != nil {
		usage()
		return 2 // the flag package said why
	}
	if !cmd.local {
		if c.client, err = g.client(cmd.longRunning); err != nil {
			fmt.Fprintln(c.stderr, "mqd:", err)
			return 2
		}
		c.json = g.json
	}
	if !cmd.local && !cmd.longRunning {
		if g.timeout <= 0 {
			fmt.Fprintf(c.stderr, "mqd %s: --timeout must be above 0, got %v\n", cmd.name, g.timeout)
			return 2
		}
		var stop func()
		ctx, stop = bounded(ctx, c.stderr, cmd.name, g.server, g.timeout)
		err = runFn(ctx, c, pos)
		stop()
		if err != nil && !errors.Is(err, errUsage) {
			defer explainFailure(c.stderr, cmd.name, g.timeout, err)
		}
	} else {
		err = runFn(ctx, c, pos)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(c.stderr, "mqd %s: %v\n", cmd.name, strings.TrimPrefix(err.Error(), "usage: "))
		usage()
		return 2
	case errors.Is(err, syscall.ECONNREFUSED):
		fmt.Fprintf(c.stderr, "mqd: %v\n(no mqd listens at --server %s; set --server or MQD_SERVER)\n", err, g.server)
		return 1
	default:
		fmt.Fprintln(c.stderr, "mqd:", err)
		return 1
	}
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// lookup finds the command args start with: two words, else one.
func lookup(args []string) (*command, []string) {
	if len(args) >= 2 {
		if c, ok := commands[args[0]+" "+args[1]]; ok {
			return c, args[2:]
		}
	}
	if c, ok := commands[args[0]]; ok {
		return c, args[1:]
	}
	return nil, nil
}

// parseInterspersed parses flags anywhere among the positional arguments
// (`mqd pub orders --key k hello`); after "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// hoistClientFlags moves client flags given before the command
// (`mqd --server URL topic list`) behind it, where the command parses
// them; other arguments are returned unchanged.
func hoistClientFlags(args []string) []string {
	var lead []string
	for len(args) > 0 {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if !strings.HasPrefix(args[0], "-") {
			break
		}
		switch {
		case name == "json" || hasValue && (name == "server" || name == "token" || name == "tls-ca"):
			lead, args = append(lead, args[0]), args[1:]
		case (name == "server" || name == "token" || name == "tls-ca") && len(args) > 1:
			lead, args = append(lead, args[0], args[1]), args[2:]
		default:
			return append(lead, args...)
		}
	}
	if len(lead) == 0 || len(args) == 0 {
		return append(lead, args...)
	}
	cmd, rest := lookup(args)
	if cmd == nil {
		return append(lead, args...)
	}
	n := len(args) - len(rest)
	return append(append(append([]string(nil), args[:n]...), lead...), rest...)
}

// globalFlags are on every client command.
type globalFlags struct {
	server, token, tlsCA string
	json                 bool
	timeout              time.Duration // one-shot commands only
}

func (g *globalFlags) define(fs *flag.FlagSet) {
	server := os.Getenv("MQD_SERVER")
	if server == "" {
		server = client.DefaultServer
	}
	fs.StringVar(&g.server, "server", server, "server URL, or several separated by commas (env MQD_SERVER)")
	fs.StringVar(&g.token, "token", os.Getenv("MQD_TOKEN"), "bearer token (env MQD_TOKEN)")
	fs.StringVar(&g.tlsCA, "tls-ca", "", "PEM file of the CA to trust for https servers")
	fs.BoolVar(&g.json, "json", false, "print the API's JSON instead of tables")
}

// client is the command's client. A one-shot command tries each server
// twice (about 0.7 s of pauses with one server, 3 s with three): a person
// who named a server that does not answer hears so at once. Requests that
// reach a node wait there for a leader, so an election seldom needs a
// retry.
func (g *globalFlags) client(longRunning bool) (*client.Client, error) {
	servers := splitList(g.server)
	attempts := 0 // the client's default
	if !longRunning {
		attempts = max(2*len(servers), 4)
	}
	return client.New(client.Config{Servers: servers, Token: g.token, TLSCAFile: g.tlsCA, MaxAttempts: attempts})
}

// printJSON writes raw JSON on one line.
func (c *cli) printJSON(raw []byte) {
	c.stdout.Write(append(trimNL(raw), '\n'))
}

func trimNL(b []byte) []byte { return []byte(strings.TrimRight(string(b), "\r\n")) }

// table returns a writer aligning tab-separated columns; Flush it.
func (c *cli) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
}

// marshalLine marshals v as one line of JSON.
func marshalLine(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types
	}
	return b
}

// isSet reports whether the command line gave flag name, whatever its
// value: a flag whose zero value means "not given" must still send an
// explicit 0 (the server then refuses it if it is out of range).
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func needArgs(args []string, n int, names string) error {
	if len(args) != n {
		return usageErr("want %s, got %d argument(s)", names, len(args))
	}
	return nil
}

// plural is "1 partition", "3 partitions".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
