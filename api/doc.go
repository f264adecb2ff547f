// Package api is mqd's HTTP interface on fasthttp: routing, strict JSON
// decoding, the single mapping from errors to statuses, transparent
// forwarding from followers to the leader, and long-polling fetches.
//
// It holds no durable state: every change goes through raftfsm.Node.Apply.
package api
