// Package client is the Go client of mqd's HTTP API: the one the mqd
// command-line client and `mqd bench` use.
//
// A Client knows a list of nodes and sends each request to one of them;
// when a node does not answer (a transport error) or answers a retryable
// 503, it moves on to the next node and tries again, with backoff, until
// the request's context ends or the attempts run out. A publish is retried
// only when a retry cannot store it twice: with an Idempotency-Key (sent
// again unchanged) or a producer sequence, or when the request never reached
// a node. Errors the broker answered are *Error values carrying its status,
// code and message.
//
// Consume runs a consumer loop: long-poll fetches, a handler per message,
// the lease extended while the handler runs, ack on success, nack with the
// handler's error on failure.
//
// It is not a connection pool for other protocols, and it keeps no state of
// its own beyond which node answered last.
package client
