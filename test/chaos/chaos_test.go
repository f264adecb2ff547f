package chaos

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/internal/testcluster"
)

var (
	seedFlag            = flag.Int64("chaos.seed", 1, "seed of the first TestChaos run (run i uses seed+i) and of TestSoak")
	runsFlag            = flag.Int("chaos.runs", 2, "TestChaos: number of runs")
	durationFlag        = flag.Duration("chaos.duration", 45*time.Second, "TestChaos: length of the fault phase of each run")
	faultsFlag          = flag.Int("chaos.faults", 1000, "most faults per run")
	keepFlag            = flag.String("chaos.keep", "", "directory where a failed run leaves its node logs, data directories, figures and client events")
	kindsFlag           = flag.String("chaos.kinds", "", "comma-separated fault kinds to use (default: all but the power cuts for TestChaos, all for TestSoak): "+strings.Join(allKinds, ","))
	snapFlag            = flag.Int("chaos.snapshot-threshold", 2048, "--snapshot-threshold of the nodes")
	trailFlag           = flag.Int("chaos.trailing-logs", 0, "--trailing-logs of the nodes (0: half the snapshot threshold); a large value keeps more log for forensics: up to a quarter of the state or 64 MiB, whichever is larger")
	noReplayFlag        = flag.Bool("chaos.no-replay", false, "no DLQ replays in the workload")
	fileSyncEntriesFlag = flag.Bool("chaos.file-sync-entries", false, "power cuts: a file fsync also makes every earlier directory entry operation durable, as on ext4 (default: only a directory fsync does)")
	noTornFlag          = flag.Bool("chaos.no-torn", false, "power cuts never tear a write (by default one in two keeps a prefix of each file's last unsynced run of writes)")
	raftLogFlag         = flag.String("chaos.raft-log", "", "--raft-log of the nodes (wal or bolt; default: the nodes' default)")
	soakFlag            = flag.Duration("soak", 0, "TestSoak: length of the fault phase (0 skips the soak)")
	processFlag         = flag.Bool("chaos.process", false, "TestChaos: also run the processing workload (stages consuming chaos-in into chaos-out with process calls)")
	stageSplitFlag      = flag.Bool("chaos.stage-split", false, "the processing workload's stages publish, then ack, as two calls (a broken stage: the checker must fail the run)")
	lightFlag           = flag.Bool("chaos.light", false, "a lighter main workload: one producer, one group, one consumer")
	tlsFlag             = flag.String("chaos.tls", "alt", "nodes with TLS certificates: on, off, or alt (TestChaos: every second run, so that CI runs both)")
	dataGroupsFlag      = flag.Bool("chaos.data-groups", false, "TestChaos, TestSoak: five nodes with --data-groups, the workload over three topics in different data groups, faults aimed at the groups' leaders and at moves")
)

// configFor is the run configuration from the flags.
func configFor(t *testing.T, seed int64, d time.Duration) Config {
	cfg := DefaultConfig(seed, d)
	cfg.MaxFaults = *faultsFlag
	cfg.Keep = *keepFlag
	cfg.SnapshotThreshold = *snapFlag
	cfg.TrailingLogs = *trailFlag
	cfg.NoReplay = *noReplayFlag
	cfg.NoTorn = *noTornFlag
	cfg.FileSyncEntries = *fileSyncEntriesFlag
	cfg.RaftLog = *raftLogFlag
	cfg.Process = *processFlag
	cfg.ProcessSplit = *stageSplitFlag
	if *dataGroupsFlag {
		dataShape(&cfg)
	}
	if *lightFlag {
		lighten(&cfg)
	}
	if *kindsFlag != "" {
		for _, k := range strings.Split(*kindsFlag, ",") {
			if !slices.Contains(allKinds, k) && !slices.Contains(dataKinds, k) {
				t.Fatalf("-chaos.kinds: unknown kind %q (kinds: %v; with -chaos.data-groups also %v)", k, allKinds, dataKinds)
			}
			if slices.Contains(dataKinds, k) && !cfg.DataGroups {
				t.Fatalf("-chaos.kinds: %s needs -chaos.data-groups", k)
			}
			cfg.Kinds = append(cfg.Kinds, k)
		}
	}
	return cfg
}

func TestMain(m *testing.M) { testcluster.Main(m) }

// TestChaos is the bounded version CI runs: a few short runs with fixed seeds.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos runs take a couple of minutes; skipped in -short mode")
	}
	for i := range *runsFlag {
		seed := *seedFlag + int64(i)
		cfg := configFor(t, seed, *durationFlag)
		cfg.TLS = useTLS(t, i)
		name := fmt.Sprintf("seed=%d", seed)
		if cfg.TLS {
			name += ",tls"
		}
		t.Run(name, func(t *testing.T) { Run(t, cfg) })
	}
}

// TestKillRestart kills nodes (-9: the leader, a follower, or all at once)
// at random points of a publish/consume/ack load, once per raft log store.
// Each node restarts on the state file it left (fsm.db is never rebuilt
// after a process crash) and replays only the log after it: the check
// finds no acknowledged publish or ack lost, and the replicas' state files
// agree key by key at one applied index.
func TestKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kill runs take a minute; skipped in -short mode")
	}
	for i, store := range []string{"wal", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := configFor(t, *seedFlag+100+int64(i), 20*time.Second)
			cfg.Kinds = []string{faultKillLeader, faultKillFollower, faultKillAll}
			cfg.RaftLog = store
			cfg.TLS = useTLS(t, i)
			Run(t, cfg)
		})
	}
}

// TestPowerCut is the bounded power-loss run CI makes, once per raft log
// store: power cuts of one node (the leader or a follower), of the leader
// and a follower at once, and of all three (internal/powerfs drops what the
// nodes had not fsynced), alternating with every other fault kind. The
// checker is the one of every run: each acknowledged write delivered, no
// duplicate completion, replicas identical.
func TestPowerCut(t *testing.T) {
	if testing.Short() {
		t.Skip("power-cut runs take a minute; skipped in -short mode")
	}
	for i, store := range []string{"wal", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := configFor(t, *seedFlag+200+int64(i), 25*time.Second)
			if *kindsFlag == "" {
				cfg.Kinds = allKinds
			}
			cfg.RaftLog = store
			cfg.TLS = useTLS(t, i)
			Run(t, cfg)
		})
	}
}

// TestChaosProcess is the bounded run of the processing workload, once
// per raft log store (the second with TLS): two stage processes consume
// chaos-in and turn each input into one output in chaos-out with a process
// call, while a stage nemesis SIGKILLs and restarts them and SIGSTOPs them
// for longer than their 1 s lease, and the cluster nemesis kills, pauses
// and partitions nodes (power cuts too with -chaos.kinds). The checker
// finds every input acked once and exactly one output per input. With
// -chaos.stage-split the stages publish and then ack, and the run fails.
func TestChaosProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("processing chaos runs take about a minute; skipped in -short mode")
	}
	for i, store := range []string{"wal", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := configFor(t, *seedFlag+300+int64(i), 15*time.Second)
			cfg.Process = true
			lighten(&cfg)
			cfg.RaftLog = store
			cfg.TLS = useTLS(t, i)
			Run(t, cfg)
		})
	}
}

// TestSoak is one long run, power cuts and the processing workload included: go test ./test/chaos/ -run Soak -soak=30m -timeout 60m -v
func TestSoak(t *testing.T) {
	if *soakFlag <= 0 {
		t.Skip("soak disabled; run with -soak=30m (and a -timeout above it)")
	}
	cfg := configFor(t, *seedFlag, *soakFlag)
	if *kindsFlag == "" {
		cfg.Kinds = allKinds
		if cfg.DataGroups {
			cfg.Kinds = append(slices.Clone(dataKinds), allKinds...)
		}
	}
	cfg.Soak = true
	cfg.Process = true
	cfg.TLS = useTLS(t, 0)
	cfg.DrainTimeout = 5 * time.Minute
	Run(t, cfg)
}

// useTLS says whether run i of this process uses TLS (-chaos.tls).
func useTLS(t *testing.T, i int) bool {
	switch *tlsFlag {
	case "on":
		return true
	case "off":
		return false
	case "alt":
		return i%2 == 1
	}
	t.Fatalf("-chaos.tls %q: want on, off or alt", *tlsFlag)
	return false
}
