package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// mainUsage is `mqd --help`: the client commands, then the server's flags.
func mainUsage(w io.Writer) {
	fmt.Fprint(w, `mqd is a durable, replicated message queue broker and its own client.

Usage:
  mqd [serve] [server flags]     run a broker (mqd serve --help lists the flags)
  mqd COMMAND [args] [flags]     talk to a broker at --server (default http://127.0.0.1:7070)
  mqd --version                  print the version, commit and Go version

Commands:
`)
	var all []*command
	for _, c := range commands {
		all = append(all, c)
	}
	listCommands(w, all)
	fmt.Fprint(w, `
Client flags (every command that talks to a server):
  --server URL[,URL...]  env MQD_SERVER; several URLs fail over
  --token TOKEN          env MQD_TOKEN; sent as a bearer token
  --tls-ca FILE          PEM CA bundle to trust for https servers
  --json                 print the API's JSON instead of tables
  --timeout D            one-shot commands (not sub, bench): give up after D [15s]

mqd COMMAND --help shows a command's flags.
`)
}

// listCommands prints cmds as an aligned list, groups in cmdOrder first.
func listCommands(w io.Writer, cmds []*command) {
	rank := func(c *command) int {
		if i := slices.Index(cmdOrder, strings.Fields(c.name)[0]); i >= 0 {
			return i
		}
		return len(cmdOrder)
	}
	sort.Slice(cmds, func(i, j int) bool {
		ri, rj := rank(cmds[i]), rank(cmds[j])
		if ri != rj {
			return ri < rj
		}
		return cmds[i].name < cmds[j].name
	})
	width := 0
	for _, c := range cmds {
		width = max(width, len(c.name)+1+len(c.args))
	}
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-*s  %s\n", width, strings.TrimSpace(c.name+" "+c.args), c.summary)
	}
}

// commandUsage is `mqd CMD --help`.
func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: mqd %s [flags]\n\n%s\n\nFlags:\n", strings.TrimSpace(c.name+" "+c.args), c.summary)
	printFlags(w, fs)
}

// printFlags lists fs's flags as --name TYPE, its usage and default.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			if typ == "string" {
				usage += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				usage += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, usage)
	})
}
