// Package testcluster starts real mqd processes for system tests and
// benchmarks: it builds the binary once per test process, runs one to N nodes
// on free loopback ports with data under the test's temporary directory,
// waits for a leader, and lets tests kill, stop, pause, restart and wipe nodes.
//
// It is for black-box tests that drive the broker over HTTP only; it never
// imports the broker's packages. Every process it starts is killed in the
// test's cleanup, on every path out of the test (including t.Fatal), and when
// the test fails the tail of each node's log is printed.
package testcluster
