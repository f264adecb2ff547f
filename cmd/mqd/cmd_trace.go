package main

import (
	"context"
	"flag"
	"fmt"
	"slices"

	"github.com/mqd/mqd/client"
)

func init() {
	register(&command{name: "trace", args: "TOPIC KEY",
		summary: "where the message with idempotency key KEY is, and its state in every group",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 2, "TOPIC KEY"); err != nil {
					return err
				}
				t, err := c.client.TraceKey(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(t.Raw)
					return nil
				}
				printTrace(c, args[0], t)
				return nil
			}
		}})
}

func printTrace(c *cli, topic string, t *client.KeyTrace) {
	at := t.PublishedAt
	if at == "" {
		at = "(removed by retention)"
	}
	fmt.Fprintf(c.stdout, "key %q in %s: partition %d, offset %d, published %s, %d duplicate publishes\n",
		t.Key, topic, t.Partition, t.Offset, at, t.Duplicates)
	if len(t.Groups) == 0 {
		fmt.Fprintln(c.stdout, "no consumer groups")
		return
	}
	fmt.Fprintln(c.stdout)
	w := c.table()
	fmt.Fprintln(w, "GROUP\tSTATE\tDELIVERIES\tLAST FAILURE")
	names := make([]string, 0, len(t.Groups))
	for n := range t.Groups {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		g := t.Groups[n]
		last := "-"
		if len(g.History) > 0 {
			h := g.History[len(g.History)-1]
			last = fmt.Sprintf("%s %s: %s", h.At, h.Kind, h.Reason)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", n, g.State, g.Deliveries, last)
	}
	w.Flush()
}
