package raftfsm

import (
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/replica"
	"github.com/prometheus/client_golang/prometheus"
)

// TallyAt is a consumer group's sums of applied events (replica.TallyAt).
type TallyAt = replica.TallyAt

// GroupTallies answers a copy of the default group's per-consumer-group
// sums of applied events (replica.Group.GroupTallies).
func (n *Node) GroupTallies() map[fsm.TopicGroup]TallyAt { return n.def.GroupTallies() }

// DropGroupTallies forgets sums of deleted consumer groups
// (replica.Group.DropGroupTallies).
func (n *Node) DropGroupTallies(keys []fsm.TopicGroup, upTo uint64) {
	n.def.DropGroupTallies(keys, upTo)
}

// Collectors returns the node's Prometheus collectors: each group's
// (labelled raft_group), raft's process-wide timings, the clock's and the
// disk guard's.
func (n *Node) Collectors() []prometheus.Collector {
	cs := append(n.def.Collectors(), replica.RaftTimings()...)
	cs = append(cs, n.clockCollectors()...)
	return append(cs, n.disk.collectors()...)
}
