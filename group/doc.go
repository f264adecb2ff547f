// Package group keeps consumer-group state in bbolt: per-partition delivery
// cursors, leases, redelivery, acks and the lease-expiry index.
//
// A group's state for a partition is a cursor (the next offset never yet
// delivered) plus one record per message that has been delivered but is not
// done: leased (in flight) or waiting to be delivered again. An offset below
// the cursor without a record is done (acked). So memory and disk grow with
// the number of messages in flight, never with the backlog.
//
// Like package log, it works inside transactions the caller owns and never
// reads the clock; it knows nothing of Raft or HTTP.
package group
