package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"

	"github.com/mqd/mqd/client"
)

// flagPartitions is topic create's flag for the topic's partitions field.
const flagPartitions = "partitions"

func init() {
	register(&command{name: "topic create", args: "NAME", summary: "create a topic, or update an existing one's config",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			partitions := fs.Int(flagPartitions, 0, "number of partitions, 1..1024 (default 1 on create; may grow, never shrink)")
			cfgJSON := fs.String("config", "", `other config fields as JSON, e.g. '{"max_retry":3,"ack_timeout_ms":60000}'`)
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "NAME"); err != nil {
					return err
				}
				cfg := client.TopicConfig{}
				if *cfgJSON != "" {
					if err := json.Unmarshal([]byte(*cfgJSON), &cfg); err != nil {
						return usageErr("--config: not a JSON object: %v", err)
					}
				}
				// Sent whenever given, 0 included: the server refuses
				// what is out of range (400 invalid_config), as for -2.
				if isSet(fs, flagPartitions) {
					cfg["partitions"] = *partitions
				}
				t, created, err := c.client.PutTopic(ctx, args[0], cfg)
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(t.Raw)
					return nil
				}
				verb := "updated"
				if created {
					verb = "created"
				}
				fmt.Fprintf(c.stdout, "%s topic %s (%s)\n", verb, t.Name, plural(len(t.Partitions), "partition"))
				return nil
			}
		}})
	register(&command{name: "topic list", summary: "list topics with their message counts",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 0, "no arguments"); err != nil {
					return err
				}
				ts, err := c.client.Topics(ctx)
				if err != nil {
					return err
				}
				if c.json {
					raws := make([]json.RawMessage, len(ts))
					for i := range ts {
						raws[i] = ts[i].Raw
					}
					c.printJSON(marshalLine(map[string]any{"topics": raws}))
					return nil
				}
				w := c.table()
				fmt.Fprintln(w, "TOPIC\tPARTITIONS\tMESSAGES\tBYTES\tGROUPS")
				for _, t := range ts {
					fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\n", t.Name, len(t.Partitions), t.Messages, t.Bytes, strings.Join(groupNames(t), ","))
				}
				return w.Flush()
			}
		}})
	register(&command{name: "topic info", args: "NAME", summary: "a topic's config, partitions and groups",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "NAME"); err != nil {
					return err
				}
				t, err := c.client.Topic(ctx, args[0])
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(t.Raw)
					return nil
				}
				return printTopic(c, t)
			}
		}})
	register(&command{name: "topic delete", args: "NAME", summary: "delete a topic with all its messages and groups",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "NAME"); err != nil {
					return err
				}
				if err := c.client.DeleteTopic(ctx, args[0]); err != nil {
					return err
				}
				if c.json {
					c.printJSON(marshalLine(map[string]string{"deleted": args[0]}))
					return nil
				}
				fmt.Fprintf(c.stdout, "deleted topic %s\n", args[0])
				return nil
			}
		}})
}

func groupNames(t client.Topic) []string {
	var gs []string
	for g := range t.Groups {
		gs = append(gs, g)
	}
	sort.Strings(gs)
	return gs
}

func printTopic(c *cli, t *client.Topic) error {
	w := c.table()
	fmt.Fprintf(w, "topic\t%s\nmessages\t%d\nbytes\t%d\n\n", t.Name, t.Messages, t.Bytes)
	var keys []string
	for k := range t.Config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintln(w, "CONFIG\tVALUE")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%v\n", k, jsonValue(t.Config[k]))
	}
	fmt.Fprintln(w, "\nPARTITION\tFIRST OFFSET\tNEXT OFFSET\tMESSAGES")
	for _, p := range t.Partitions {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\n", p.Partition, p.FirstOffset, p.NextOffset, p.Messages)
	}
	if gs := groupNames(*t); len(gs) > 0 {
		fmt.Fprintln(w, "\nGROUP\tBACKLOG\tIN FLIGHT\tDELAYED\tDLQ\tACKED\tDUPLICATES SKIPPED\tREPLAY PENDING")
		for _, name := range gs {
			g := t.Groups[name]
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", name, g.Backlog, g.InFlight, g.Delayed, g.DLQ, g.Acked,
				g.DuplicatesSkipped, g.ReplayPending)
		}
	}
	return w.Flush()
}

// jsonValue prints whole numbers without an exponent.
func jsonValue(v any) any {
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return int64(f)
	}
	return v
}
