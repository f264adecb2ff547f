// Package replica is one replicated (Raft) group as a node holds it:
// replica.Group, with its raft instance, log and stable stores, snapshots
// and snapshot policy, state machine (package fsm), group commit and
// proposals, leader loop and housekeeping (package housekeep), hand-off,
// lost-log guard and vote gate, and metrics labelled raft_group. What the
// process shares between groups (package raftfsm, the node) takes part
// through GroupConfig's Hooks.
package replica
