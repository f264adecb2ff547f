package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/mqd/mqd/client"
)

// reconcileChunk is the most keys one reconcile request carries.
const reconcileChunk = 10000

func init() {
	register(&command{name: "reconcile", args: "TOPIC",
		summary: "check a ledger of keys against TOPIC: missing ones, and each group's acked, pending, in flight and dead; exit status 0 only when none is missing",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			grp := fs.String("group", "", "only this consumer group")
			file := fs.String("keys-file", "", "the keys, one a line (- for stdin; required)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "TOPIC"); err != nil {
					return err
				}
				if *file == "" {
					return usageErr("--keys-file is required (- for stdin)")
				}
				keys, err := readKeys(c.stdin, *file)
				if err != nil {
					return err
				}
				rec, err := reconcileAll(ctx, c.client, args[0], keys, *grp)
				if err != nil {
					return err
				}
				if c.json {
					b, _ := json.Marshal(rec)
					c.printJSON(b)
				} else {
					printReconcile(c, args[0], len(keys), rec)
				}
				if len(rec.Missing) > 0 {
					return fmt.Errorf("%d of %d keys missing from %s", len(rec.Missing), len(keys), args[0])
				}
				return nil
			}
		}})
}

// readKeys reads one key a line (blank lines skipped) from path, or from
// in when path is "-".
func readKeys(in io.Reader, path string) ([]string, error) {
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	var keys []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if k := strings.TrimRight(sc.Text(), "\r"); k != "" {
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading keys: %w", err)
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys given")
	}
	return keys, nil
}

// reconcileAll reconciles keys in requests of reconcileChunk and merges
// the answers.
func reconcileAll(ctx context.Context, cl *client.Client, topic string, keys []string, group string) (*client.Reconciliation, error) {
	all := &client.Reconciliation{Missing: []string{}, Groups: map[string]client.GroupKeys{}}
	for chunk := range slices.Chunk(keys, reconcileChunk) {
		r, err := cl.Reconcile(ctx, topic, chunk, group)
		if err != nil {
			return nil, err
		}
		all.Missing = append(all.Missing, r.Missing...)
		all.Stored += r.Stored
		for n, g := range r.Groups {
			a := all.Groups[n]
			a.Acked = append(nonNil(a.Acked), g.Acked...)
			a.Pending = append(nonNil(a.Pending), g.Pending...)
			a.InFlight = append(nonNil(a.InFlight), g.InFlight...)
			a.Dead = append(nonNil(a.Dead), g.Dead...)
			all.Groups[n] = a
		}
	}
	return all, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func printReconcile(c *cli, topic string, n int, r *client.Reconciliation) {
	fmt.Fprintf(c.stdout, "%d keys checked against %s: %d stored, %d missing\n", n, topic, r.Stored, len(r.Missing))
	for i, k := range r.Missing {
		if i == 20 {
			fmt.Fprintf(c.stdout, "  ... and %d more (--json lists them all)\n", len(r.Missing)-20)
			break
		}
		fmt.Fprintf(c.stdout, "  missing %s\n", k)
	}
	if len(r.Groups) == 0 {
		return
	}
	fmt.Fprintln(c.stdout)
	w := c.table()
	fmt.Fprintln(w, "GROUP\tACKED\tPENDING\tIN FLIGHT\tDEAD")
	names := make([]string, 0, len(r.Groups))
	for g := range r.Groups {
		names = append(names, g)
	}
	slices.Sort(names)
	for _, g := range names {
		k := r.Groups[g]
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", g, len(k.Acked), len(k.Pending), len(k.InFlight), len(k.Dead))
	}
	w.Flush()
}
