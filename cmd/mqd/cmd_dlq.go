package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/mqd/mqd/client"
)

// idFlags collects repeated --id N (or --id 1,2,3).
type idFlags []uint64

func (f *idFlags) String() string { return "" }
func (f *idFlags) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(p), 10, 64)
		if err != nil || id == 0 {
			return fmt.Errorf("want a positive dead-letter id, got %q", p)
		}
		*f = append(*f, id)
	}
	return nil
}

func init() {
	register(&command{name: "dlq list", args: "TOPIC GROUP", summary: "a group's dead letters, oldest first, with their last failure",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			limit := fs.Int("limit", 100, "at most this many (1..1000)")
			after := fs.Uint64("after", 0, "start after this id (paging)")
			key := fs.String("key", "", "only the dead letters with this idempotency key")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 2, "TOPIC GROUP"); err != nil {
					return err
				}
				p, err := c.client.DeadLetters(ctx, args[0], args[1], client.DLQOptions{Limit: *limit, After: *after, IdempotencyKey: *key})
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(p.Raw)
					return nil
				}
				w := c.table()
				fmt.Fprintln(w, "ID\tPARTITION\tOFFSET\tKEY\tRETRIES\tDEAD AT\tLAST KIND\tREASON")
				for _, d := range p.DeadLetters {
					kind := ""
					if len(d.History) > 0 {
						kind = d.History[len(d.History)-1].Kind
					}
					fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.Partition, d.Offset, d.IdempotencyKey,
						d.RetryCount, d.DeadAt, kind, oneLine(d.RejectReason))
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if p.NextAfter != nil {
					fmt.Fprintf(c.stderr, "more: mqd dlq list %s %s --after %d\n", args[0], args[1], *p.NextAfter)
				}
				return nil
			}
		}})
	register(&command{name: "dlq replay", args: "TOPIC GROUP (--all | --id ID...)",
		summary: "put dead letters back into the group's delivery, at --rate per second",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			all := fs.Bool("all", false, "replay every dead letter of the group")
			var ids idFlags
			fs.Var(&ids, "id", "a dead letter's id (repeatable, or comma-separated)")
			rate := fs.Int("rate", 0, "messages per second (default: the broker's, 100)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 2, "TOPIC GROUP"); err != nil {
					return err
				}
				if *all == (len(ids) > 0) {
					return usageErr("give either --all or --id")
				}
				if isSet(fs, "rate") && (*rate < 1 || *rate > 100000) {
					return usageErr("--rate must be in 1..100000, got %d", *rate)
				}
				r, err := c.client.Replay(ctx, args[0], args[1], ids, *rate)
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(r.Raw)
					return nil
				}
				fmt.Fprintf(c.stdout, "replaying %d dead letter(s) at %d per second\n", r.Accepted, r.RatePerSec)
				return nil
			}
		}})
	register(&command{name: "dlq delete", args: "TOPIC GROUP ID", summary: "discard one dead letter",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 3, "TOPIC GROUP ID"); err != nil {
					return err
				}
				id, err := strconv.ParseUint(args[2], 10, 64)
				if err != nil || id == 0 {
					return usageErr("ID must be a positive integer, got %q", args[2])
				}
				if err := c.client.DeleteDeadLetter(ctx, args[0], args[1], id); err != nil {
					return err
				}
				if c.json {
					c.printJSON(marshalLine(map[string]uint64{"deleted": id}))
					return nil
				}
				fmt.Fprintf(c.stdout, "deleted dead letter %d\n", id)
				return nil
			}
		}})
}

func oneLine(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "\t", " ") }
