package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/mqd/mqd/raftfsm"
)

func init() {
	register(&command{name: "restore", args: "--data-dir DIR FILE",
		summary: "make a new data dir holding a backup (GET /v1/cluster/backup), for a new one-node cluster (no server involved)",
		local:   true,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			dataDir := fs.String(flagDataDir, "", "the new data dir (must not exist or be empty)")
			id := fs.String(flagID, "", "id of the node that will start on it (default: the raft address); start it with the same --id")
			raftAddr := fs.String(flagRaftAddr, "127.0.0.1:7071", "raft address of that node; start it with the same --raft-addr")
			advertise := fs.String(flagRaftAdvertise, "", "raft address peers dial (default: --raft-addr); start it with the same")
			return func(_ context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "FILE"); err != nil {
					return err
				}
				if *dataDir == "" {
					return usageErr("--data-dir is required")
				}
				addr := *advertise
				if addr == "" {
					addr = *raftAddr
				}
				nodeID := *id
				if nodeID == "" {
					nodeID = addr
				}
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				res, err := raftfsm.PrepareRestore(*dataDir, f, nodeID, addr)
				if err != nil {
					return err
				}
				start := fmt.Sprintf("mqd --data-dir %s --id %s --raft-addr %s", *dataDir, nodeID, *raftAddr)
				if *advertise != "" {
					start += " --raft-advertise-addr " + *advertise
				}
				fmt.Fprintf(c.stdout, "restored the state at raft index %d into %s for node %s (raft address %s)\n",
					res.Index, *dataDir, nodeID, addr)
				for _, g := range slices.Sorted(maps.Keys(res.Groups)) {
					fmt.Fprintf(c.stdout, "restored data group %s at its raft index %d, with %s its only member\n", g, res.Groups[g], nodeID)
				}
				fmt.Fprintf(c.stdout, "start it: %s --http-addr HOST:PORT [--auth-file FILE]  (other nodes then join it with --join)\n", start)
				return nil
			}
		}})
}
