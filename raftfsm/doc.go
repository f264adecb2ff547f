// Package raftfsm is mqd's replicated state machine and Raft node: the
// command codec, the FSM that applies each Raft batch in one bbolt
// transaction, snapshots, and the node's setup, bootstrap and join.
//
// It is not the HTTP layer (package api) and it does not own the data
// layouts (packages log and group): Apply is a thin adapter over one switch.
package raftfsm
