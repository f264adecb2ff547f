// Package raftfsm is mqd's Raft node: the raft instance and its stores
// (raft-wal log, stable store, snapshots), group commit, the node's setup,
// bootstrap and join, membership, peer probes, the clock and disk guards,
// readiness, handoff and the leader's housekeeping. The state machine it
// replicates is package fsm; the commands it proposes are package command.
//
// It is not the HTTP layer (package api).
package raftfsm
