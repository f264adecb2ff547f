package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/mqd/mqd/client"
)

func init() {
	register(&command{name: "cluster status", summary: "the leader and every node with its state",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 0, "no arguments"); err != nil {
					return err
				}
				st, err := c.client.Cluster(ctx)
				if err != nil {
					return err
				}
				if c.json {
					c.printJSON(st.Raw)
					return nil
				}
				return printCluster(c, st)
			}
		}})
	register(&command{name: "cluster remove", args: "ID", summary: "remove a node from the cluster",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "ID"); err != nil {
					return err
				}
				if err := c.client.RemoveNode(ctx, args[0]); err != nil {
					return err
				}
				if c.json {
					c.printJSON(marshalLine(map[string]string{"removed": args[0]}))
					return nil
				}
				fmt.Fprintf(c.stdout, "removed node %s\n", args[0])
				return nil
			}
		}})
	moves := func(name, args, summary string, do func(context.Context, *cli, []string) ([]client.Move, error)) {
		register(&command{name: name, args: args, summary: summary,
			setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
				return func(ctx context.Context, c *cli, a []string) error {
					want, usage := 0, "no arguments"
					if args != "" {
						want, usage = 1, args
					}
					if err := needArgs(a, want, usage); err != nil {
						return err
					}
					ms, err := do(ctx, c, a)
					if err != nil {
						return err
					}
					if c.json {
						c.printJSON(marshalLine(map[string]any{"moves": ms}))
						return nil
					}
					return printMoves(c, ms)
				}
			}})
	}
	moves("cluster drain", "ID", "move every data group replica off a node (before removing it)",
		func(ctx context.Context, c *cli, a []string) ([]client.Move, error) { return c.client.Drain(ctx, a[0]) })
	moves("cluster rebalance", "", "even out data group replicas and leaders over the nodes",
		func(ctx context.Context, c *cli, _ []string) ([]client.Move, error) { return c.client.Rebalance(ctx) })
}

// printMoves lists the moves a drain or a rebalance recorded.
func printMoves(c *cli, ms []client.Move) error {
	if len(ms) == 0 {
		fmt.Fprintln(c.stdout, "nothing to move")
		return nil
	}
	w := c.table()
	fmt.Fprintln(w, "GROUP\tFROM\tTO\tPREFERRED LEADER")
	for _, m := range ms {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.Group, dash(m.From), dash(m.To), m.Leader)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, "\nrecorded; each group's leader moves its replicas now (mqd cluster status shows the groups)")
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printCluster(c *cli, st *client.ClusterStatus) error {
	leader := "none (election in progress, or no quorum)"
	if st.Leader != nil {
		leader = st.Leader.ID + " (" + st.Leader.HTTPAddr + ")"
	}
	fmt.Fprintf(c.stdout, "leader %s; answered by %s (applied %d, commit %d, snapshot %d, state format %d)\n\n",
		leader, st.Self, st.AppliedIndex, st.CommitIndex, st.LastSnapshotIndex, st.StateFormat)
	w := c.table()
	fmt.Fprintln(w, "ID\tSTATE\tHTTP\tRAFT\tVOTER\tLAST CONTACT\tREADS FORMAT")
	for _, n := range st.Nodes {
		contact := "-"
		switch {
		case n.LastContactMs == nil:
		case *n.LastContactMs < 0:
			contact = "never"
		default:
			contact = fmt.Sprintf("%d ms", *n.LastContactMs)
		}
		reads := "-" // a binary older than formats, or not probed yet
		if n.StateFormatMax > 0 {
			reads = fmt.Sprintf("<= %d", n.StateFormatMax)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\t%s\n", n.ID, n.State, n.HTTPAddr, n.RaftAddr, n.Voter, contact, reads)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(st.Groups) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout)
	w = c.table()
	fmt.Fprintln(w, "DATA GROUP\tMEMBERS\tLEADER\tTOPICS")
	for _, g := range st.Groups {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\n", g.ID, strings.Join(g.Members, ","), dash(g.Leader), g.Topics)
	}
	return w.Flush()
}
