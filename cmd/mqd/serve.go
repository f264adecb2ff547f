package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mqd/mqd/api"
	"github.com/mqd/mqd/auth"
	"github.com/mqd/mqd/raftfsm"
	"github.com/mqd/mqd/replica"
	"github.com/mqd/mqd/tlsconf"
)

// Flag names; each is also read from MQD_<NAME> (upper case, '-' → '_').
const (
	flagID                = "id"
	flagDataDir           = "data-dir"
	flagHTTPAddr          = "http-addr"
	flagRaftAddr          = "raft-addr"
	flagRaftAdvertise     = "raft-advertise-addr"
	flagHTTPAdvertise     = "http-advertise-addr"
	flagBootstrapExpect   = "bootstrap-expect"
	flagJoin              = "join"
	flagSnapshotThreshold = "snapshot-threshold"
	flagSnapshotInterval  = "snapshot-interval"
	flagTrailingLogs      = "trailing-logs"
	flagLogLevel          = "log-level"
	flagLogFormat         = "log-format"
	flagPprof             = "pprof"
	flagMetricsGroups     = "metrics-group-series"
	flagMinFreeDisk       = "min-free-disk"
	flagMaxClockOffset    = "max-clock-offset"
	flagAcceptClock       = "accept-clock"
	flagAuthFile          = "auth-file"
	flagNodeToken         = "node-token"
	flagInsecure          = "insecure"
	flagRaftLog           = "raft-log"
	flagTLSCert           = "tls-cert"
	flagTLSKey            = "tls-key"
	flagTLSCA             = "tls-ca"
	flagRatePerToken      = "rate-per-token"
	flagRatePerConn       = "rate-per-connection"
	flagMaxConns          = "max-connections"
	flagMaxConnsPerIP     = "max-connections-per-ip"
	flagHTTPReadTimeout   = "http-read-timeout"
	flagHTTPIdleTimeout   = "http-idle-timeout"
	flagForwardConns      = "forward-connections"
	flagForwardCoalesce   = "forward-coalesce"
	flagDataGroups        = "data-groups"
	flagBodyBudget        = "http-body-budget-mib"
	flagMemoryLimit       = "memory-limit-mib"
)

type options struct {
	id, dataDir, httpAddr, raftAddr, raftAdvertise, join, logLevel, raftLog string
	httpAdvertise                                                           string
	logFormat                                                               string
	pprof, acceptClock                                                      bool
	metricsGroups                                                           bool
	forwardCoalesce, dataGroups                                             bool
	authFile, nodeToken                                                     string
	tlsCert, tlsKey, tlsCA                                                  string
	ratePerToken, ratePerConn                                               float64
	insecure                                                                bool
	bootstrapExpect                                                         int
	snapshotThreshold, trailingLogs                                         uint64
	snapshotInterval                                                        time.Duration
	maxClockOffset                                                          time.Duration
	minFreeDisk                                                             raftfsm.MinFree
	limits                                                                  api.Limits
	memoryLimitMiB                                                          int64
}

// serverFlags defines the server's flags on a new flag set, into o. The
// set prints nothing on --help: the caller prints serverUsage to stdout.
func serverFlags(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("mqd", flag.ContinueOnError)
	fs.Usage = func() {}
	fs.StringVar(&o.id, flagID, "", "node id, unique in the cluster (default: the raft advertise address)")
	fs.StringVar(&o.dataDir, flagDataDir, "./mqd-data", "directory for the raft log, snapshots and state")
	fs.StringVar(&o.httpAddr, flagHTTPAddr, "127.0.0.1:7070", "HTTP listen address (also what peers forward to, unless --http-advertise-addr)")
	fs.StringVar(&o.raftAddr, flagRaftAddr, "127.0.0.1:7071", "Raft transport listen address")
	fs.StringVar(&o.httpAdvertise, flagHTTPAdvertise, "", "HTTP address other nodes reach this one at (default: --http-addr; with an unspecified host such as 0.0.0.0, this machine's host name and its port)")
	fs.StringVar(&o.raftAdvertise, flagRaftAdvertise, "", "Raft address peers dial (default: --raft-addr; with an unspecified host such as 0.0.0.0, this machine's host name and its port)")
	fs.IntVar(&o.bootstrapExpect, flagBootstrapExpect, 0, "with --join: form a new cluster once N nodes have found each other")
	fs.StringVar(&o.join, flagJoin, "", "comma-separated HTTP addresses of other nodes")
	fs.Uint64Var(&o.snapshotThreshold, flagSnapshotThreshold, 8192, "raft log entries between snapshots of a state under 4 MiB (any state is also snapshotted once the log since the last one holds half its size in bytes)")
	fs.DurationVar(&o.snapshotInterval, flagSnapshotInterval, 30*time.Second, "how often to check whether to snapshot")
	fs.Uint64Var(&o.trailingLogs, flagTrailingLogs, 10240, "raft log entries kept after a snapshot, at most (fewer when they hold more than a quarter of the state's size, or 64 MiB if more)")
	fs.StringVar(&o.raftLog, flagRaftLog, replica.LogStoreWAL, "raft log store of a new data dir: wal (raft-wal segments) or bolt (raft-boltdb); an existing data dir keeps its own")
	fs.StringVar(&o.logLevel, flagLogLevel, "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.logFormat, flagLogFormat, "text", "log format: text (logfmt) or json (one object per line)")
	fs.BoolVar(&o.pprof, flagPprof, false, "serve Go profiles at /debug/pprof/ (needs the monitor permission with --auth-file)")
	fs.BoolVar(&o.forwardCoalesce, flagForwardCoalesce, true,
		"a follower sends publishes to the leader as commands on a stream, instead of forwarding each HTTP request (false: HTTP forwarding, as before 0.3; docs/performance.md)")
	fs.BoolVar(&o.dataGroups, flagDataGroups, true,
		"on the metadata leader: place every new topic in a data group, a raft group of its own spread over the nodes (false: new topics go to the metadata group, as before 0.3; docs/operations.md, Data groups)")
	fs.BoolVar(&o.metricsGroups, flagMetricsGroups, true,
		"write the per-group series of the state on /metrics (false: per-topic only, for states with too many groups to scrape)")
	fs.Func(flagMinFreeDisk, "free space to keep on the data dir's filesystem: bytes, KiB/MiB/GiB, or a percentage; below it (plus one 64 MiB raft-wal segment) writes that add data answer 507 (default 5%, at most 1GiB; 0: off)",
		func(v string) (err error) { o.minFreeDisk, err = raftfsm.ParseMinFree(v); return err })
	fs.DurationVar(&o.maxClockOffset, flagMaxClockOffset, raftfsm.DefaultMaxClockOffset, "a node whose clock is further than this from a majority of the voters' does not lead and is not ready (positive)")
	fs.BoolVar(&o.acceptClock, flagAcceptClock, false, "the only voter of a cluster leads even when its clock is ahead of the one it recorded when it last ran plus the time it was down (by more than --max-clock-offset); without it, it waits, not ready")
	fs.StringVar(&o.authFile, flagAuthFile, "", "JSON file of access tokens (SHA-256 hashes and permissions); re-read on SIGHUP")
	fs.StringVar(&o.nodeToken, flagNodeToken, "", "token (with the cluster permission) this node sends on node-to-node calls when TLS is off")
	fs.BoolVar(&o.insecure, flagInsecure, false, "serve without --auth-file on a non-loopback --http-addr")
	fs.StringVar(&o.tlsCert, flagTLSCert, "", "PEM certificate (chain) of this node: HTTPS only, mutual TLS between nodes; re-read on SIGHUP")
	fs.StringVar(&o.tlsKey, flagTLSKey, "", "PEM private key of --tls-cert")
	fs.StringVar(&o.tlsCA, flagTLSCA, "", "PEM CA certificate(s) that sign the cluster's node certificates")
	rates := api.DefaultRateLimits()
	fs.Float64Var(&o.ratePerToken, flagRatePerToken, rates.PerToken, "requests per second each token may send to this node, in bursts of one second's worth; over it 429 (0: no limit)")
	fs.Float64Var(&o.ratePerConn, flagRatePerConn, rates.PerConnection, "requests per second each client connection may send, in bursts of one second's worth; over it 429 (0: no limit)")
	d := api.DefaultLimits()
	fs.IntVar(&o.limits.MaxConns, flagMaxConns, d.MaxConns, "most client connections open at once (503 beyond; capped by the open-file limit)")
	fs.IntVar(&o.limits.MaxConnsPerIP, flagMaxConnsPerIP, d.MaxConnsPerIP, "most connections open from one client address (429 beyond)")
	fs.DurationVar(&o.limits.ReadTimeout, flagHTTPReadTimeout, d.ReadTimeout, "time for a new connection's first request, and for each request head; a body gets this plus 1 s per MiB")
	fs.DurationVar(&o.limits.IdleTimeout, flagHTTPIdleTimeout, d.IdleTimeout, "idle keep-alive connections are closed after this")
	fs.IntVar(&o.limits.ForwardConns, flagForwardConns, d.ForwardConns, "most connections a follower opens to the leader to forward requests (long-polls use at most half)")
	fs.Int64Var(&o.memoryLimitMiB, flagMemoryLimit, 1024, "soft limit of the Go heap in MiB (runtime/debug.SetMemoryLimit; 0: none; the GOMEMLIMIT environment variable wins)")
	fs.Func(flagBodyBudget, fmt.Sprintf("MiB of request bodies admitted at once (bodies over 64 KiB count; beyond, 503 with Retry-After; at least 17) (default %d)", d.BodyBudget>>20),
		func(v string) error {
			mib, err := strconv.ParseInt(v, 10, 64)
			if err != nil || mib < 17 || mib > 1<<20 {
				return fmt.Errorf("want an integer number of MiB in [17, %d]", 1<<20)
			}
			o.limits.BodyBudget = mib << 20
			return nil
		})
	return fs
}

// serverUsage is `mqd serve --help`.
func serverUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: mqd [serve] [flags]")
	printFlags(w, serverFlags(&options{}))
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := serverFlags(o)
	// Environment first, so that flags on the command line win.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		env := "MQD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && envErr == nil {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s: %w", env, err)
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.raftLog != replica.LogStoreWAL && o.raftLog != replica.LogStoreBolt {
		return nil, fmt.Errorf("--%s: %q is neither %s nor %s", flagRaftLog, o.raftLog, replica.LogStoreWAL, replica.LogStoreBolt)
	}
	if o.limits.MaxConns < 1 || o.limits.MaxConnsPerIP < 1 || o.limits.ForwardConns < 2 ||
		o.limits.ReadTimeout <= 0 || o.limits.IdleTimeout <= 0 {
		return nil, fmt.Errorf("--%s, --%s must be at least 1, --%s at least 2, --%s and --%s positive",
			flagMaxConns, flagMaxConnsPerIP, flagForwardConns, flagHTTPReadTimeout, flagHTTPIdleTimeout)
	}
	if o.bootstrapExpect < 0 || (o.bootstrapExpect > 0 && o.join == "") {
		return nil, errors.New("--bootstrap-expect needs --join with the other nodes' HTTP addresses")
	}
	if o.maxClockOffset <= 0 {
		// raftfsm would take a non-positive offset for its default.
		return nil, fmt.Errorf("--%s must be positive, got %v", flagMaxClockOffset, o.maxClockOffset)
	}
	if o.ratePerToken < 0 || o.ratePerConn < 0 {
		return nil, errors.New("--rate-per-token and --rate-per-connection must not be negative")
	}
	if (o.tlsCert != "" || o.tlsKey != "" || o.tlsCA != "") && (o.tlsCert == "" || o.tlsKey == "" || o.tlsCA == "") {
		return nil, errors.New("--tls-cert, --tls-key and --tls-ca go together")
	}
	if o.authFile == "" && !o.insecure && !loopback(o.httpAddr) {
		return nil, fmt.Errorf("--http-addr %s is not a loopback address: give --auth-file (tokens) or, to serve openly anyway, --insecure", o.httpAddr)
	}
	var err error
	if o.httpAdvertise, err = advertised(flagHTTPAdvertise, o.httpAdvertise, o.httpAddr); err != nil {
		return nil, err
	}
	if o.raftAdvertise, err = advertised(flagRaftAdvertise, o.raftAdvertise, o.raftAddr); err != nil {
		return nil, err
	}
	return o, nil
}

// advertised is the address other nodes reach a listener at: given, if
// it was (flag names it); else listen, unless listen's host is
// unspecified (0.0.0.0, ::, none), which no peer can dial: then this
// machine's host name with listen's port (in a container, the name other
// containers and pods resolve to it).
func advertised(name, given, listen string) (string, error) {
	if given != "" {
		if ip, err := unspecifiedHost(given); err != nil || ip {
			return "", fmt.Errorf("--%s %q: want a host:port other nodes can dial", name, given)
		}
		return given, nil
	}
	if ip, err := unspecifiedHost(listen); err != nil || !ip {
		return listen, nil // a bad listen address fails when it is listened on
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "", fmt.Errorf("listening on %s: --%s is needed (no host name: %v)", listen, name, err)
	}
	_, port, _ := net.SplitHostPort(listen)
	return net.JoinHostPort(host, port), nil
}

// unspecifiedHost reports whether addr's host is empty, 0.0.0.0 or ::.
func unspecifiedHost(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified(), nil
}

// serve runs the server with the given flags (`mqd [flags]`, `mqd serve [flags]`).
func serve(args []string) int {
	o, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			serverUsage(os.Stdout)
			return 0
		}
		fmt.Fprintln(os.Stderr, "mqd:", err)
		return 2
	}
	if err := run(o); err != nil {
		slog.Error("mqd stopped", "err", err)
		return 1
	}
	return 0
}

func run(o *options) error {
	// SIGHUP is caught from the start: its default action would end a
	// node that config management signals while it is still starting.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set && o.memoryLimitMiB > 0 {
		// A soft limit: the GC works harder near it instead of letting
		// the heap double between collections (large bodies made that
		// 1.8 GB of anonymous memory for a 128 MiB body budget).
		debug.SetMemoryLimit(o.memoryLimitMiB << 20)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger, err := newLogger(os.Stderr, o.logFormat, level)
	if err != nil {
		return err
	}
	slog.SetDefault(logger)
	nofile, err := raiseFileLimit(logger)
	if err != nil {
		return err
	}
	if c := connCap(nofile); o.limits.MaxConns > c {
		logger.Warn("--max-connections lowered to fit the open-file limit", "asked", o.limits.MaxConns, "limit", c, "nofile", nofile)
		o.limits.MaxConns = c
	}
	var tokens *auth.Store
	if o.authFile != "" {
		var err error
		if tokens, err = auth.Load(o.authFile); err != nil {
			return err
		}
		logger.Info("auth: tokens loaded", "file", o.authFile, "tokens", tokens.Len())
		if o.tlsCert == "" && o.nodeToken == "" {
			logger.Warn("auth without TLS and without --node-token (MQD_NODE_TOKEN): other nodes will refuse this node's join and status calls (a follower is not ready without them); a single node is unaffected")
		}
	}
	var certs *tlsconf.Store
	if o.tlsCert != "" {
		var err error
		if certs, err = tlsconf.Load(tlsconf.Files{Cert: o.tlsCert, Key: o.tlsKey, CA: o.tlsCA}); err != nil {
			return err
		}
		logger.Info("tls: certificates loaded", "cert", o.tlsCert, "ca", o.tlsCA, "not_after", certs.NotAfter())
	}
	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	node, err := raftfsm.Open(raftfsm.Config{
		ID: o.id, DataDir: o.dataDir, RaftAddr: o.raftAddr, RaftAdvertise: o.raftAdvertise, HTTPAddr: o.httpAdvertise,
		NodeToken:         o.nodeToken,
		TLS:               certs,
		SnapshotThreshold: o.snapshotThreshold, SnapshotInterval: o.snapshotInterval, TrailingLogs: o.trailingLogs,
		MinFreeDisk: o.minFreeDisk, MaxClockOffset: o.maxClockOffset, AcceptClock: o.acceptClock, RaftLog: o.raftLog, Logger: logger,
	})
	if err != nil {
		ln.Close()
		return err
	}
	srv := api.New(node, logger, api.Options{Auth: tokens, TLS: certs, Pprof: o.pprof,
		Rates: api.RateLimits{PerToken: o.ratePerToken, PerConnection: o.ratePerConn}, Limits: o.limits,
		NoGroupSeries: !o.metricsGroups, NodeToken: o.nodeToken,
		CoalesceForward: o.forwardCoalesce, DataGroups: o.dataGroups})
	// Connection limits count TCP connections, under TLS.
	ln = srv.LimitListener(ln)
	if certs != nil {
		// Users authenticate with tokens; nodes present certificates.
		ln = certs.Listener(ln, tls.VerifyClientCertIfGiven, 10*time.Second)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go reloadOnHUP(ctx, hup, logger, tokens, certs)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	// The node runs until the HTTP server has stopped, past the signal.
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	go node.Run(runCtx)
	go func() {
		if err := node.Form(runCtx, splitList(o.join), o.bootstrapExpect); err != nil && runCtx.Err() == nil {
			logger.Error("forming cluster", "err", err)
		}
	}()
	logger.Info("mqd started", "id", node.ID(), "http", o.httpAddr, "http_advertise", o.httpAdvertise,
		"raft", o.raftAddr, "raft_advertise", o.raftAdvertise, "data", o.dataDir,
		"max_connections", o.limits.MaxConns, "open_file_limit", nofile)
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		node.Shutdown()
		return fmt.Errorf("http: %w", err)
	}
	// Graceful stop, within stopTimeout (plus raft's own shutdown): a leader hands leadership off
	// first while it still serves HTTP (what arrives meanwhile is forwarded
	// to the new leader); then the listener closes and the requests in
	// flight finish; then raft stops.
	logger.Info("shutting down")
	start := time.Now()
	hctx, hcancel := context.WithTimeout(context.Background(), handOffTimeout)
	node.HandOff(hctx)
	hcancel()
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout-time.Since(start))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("http shutdown", "err", err)
	}
	stopRun()
	// Raft's own shutdown is bounded too: it can wait on a leadership
	// transfer that does not finish. Exiting without it is safe, as after
	// a crash: the raft log is fsynced, the state file recovers (fsmstate.go).
	stopped := make(chan error, 1)
	go func() { stopped <- node.Shutdown() }()
	select {
	case err = <-stopped:
	case <-time.After(raftStopTimeout):
		logger.Warn("raft did not stop in time; exiting without it", "waited", raftStopTimeout)
		err = nil
	}
	logger.Info("stopped", "took", time.Since(start))
	return err
}

// Graceful stop bounds: the hand-off, then everything.
const (
	handOffTimeout  = 3 * time.Second
	stopTimeout     = 6 * time.Second
	raftStopTimeout = 3 * time.Second
)

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// loopback reports whether addr (host:port) listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// reloadOnHUP re-reads the token file and the certificates on every
// SIGHUP until ctx ends. What does not load keeps what was in force; the
// log says why.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, logger *slog.Logger, tokens *auth.Store, certs *tlsconf.Store) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if tokens == nil && certs == nil {
			logger.Info("SIGHUP: nothing to reload")
		}
		if tokens != nil {
			if err := tokens.Reload(); err != nil {
				logger.Error("SIGHUP: auth file not reloaded, the previous tokens stay in force", "err", err)
			} else {
				logger.Info("SIGHUP: auth file reloaded", "tokens", tokens.Len())
			}
		}
		if certs != nil {
			if err := certs.Reload(); err != nil {
				logger.Error("SIGHUP: certificates not reloaded, the previous ones stay in force", "err", err)
			} else {
				logger.Info("SIGHUP: certificates reloaded", "not_after", certs.NotAfter())
			}
		}
	}
}

// newLogger is the process's one logger: every line, raft's included,
// goes through it in one format.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--%s: %q is neither text nor json", flagLogFormat, format)
}
