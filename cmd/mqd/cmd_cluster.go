package main

import (
	"context"
	"flag"
	"fmt"

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
	return w.Flush()
}
