// Package raftfsm is mqd's node: the process and what every replicated
// group on it shares (the data dir and its lock, the raft transport, the
// node id, bootstrap and join, membership, peer probes, the clock and disk
// guards, readiness), and the groups it holds (package replica: today one,
// the default group, in the data dir itself). The state machine the groups
// replicate is package fsm; the commands they propose are package command.
//
// It is not the HTTP layer (package api).
package raftfsm
