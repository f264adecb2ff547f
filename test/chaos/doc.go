// Package chaos is a Jepsen-style fault-injection harness for mqd: a real
// three-node cluster (internal/testcluster) whose Raft links run through
// proxies in this process (proxy.go), a workload of idempotent producers,
// consumers in several groups and a dead-letter replayer (workload.go), a
// nemesis that kills, pauses, partitions and restarts nodes on a seeded
// schedule (nemesis.go), and a checker that, after healing and draining,
// accounts for every acknowledged message in every group exactly once
// (checker.go) and compares the replicas' state files (replicas.go).
//
// A processing workload (process.go, processcheck.go) runs beside it in
// TestChaosProcess and TestSoak: stage processes (./stage) turn each input
// of one topic into one output of another with a process call while a
// nemesis of their own SIGKILLs them and SIGSTOPs them past their lease;
// its checker finds every input acked once and exactly one output each.
//
// TestChaos runs two short runs with fixed seeds (CI); TestSoak runs one long
// one with -soak=30m. See docs/reliability.md for the fault model, its limits,
// and how to reproduce a run from its seed.
package chaos
