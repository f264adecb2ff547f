package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsConfig is the configuration file text of JetStream node i (0,
// 1 or 2) of a three-node cluster whose route ports are clusterPorts. With
// always, JetStream fsyncs every write (`sync_interval: always`); without, it
// keeps its default (a background fsync every 2 minutes).
func jsConfig(i, clientPort int, storeDir string, always bool, clusterPorts []int) string {
	sync := ""
	if always {
		sync = "\n  sync_interval: always"
	}
	routes := make([]string, len(clusterPorts))
	for j, p := range clusterPorts {
		routes[j] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	return fmt.Sprintf(`server_name: n%d
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q%s
}
cluster {
  name: peers-bench
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, i+1, clientPort, storeDir, sync, clusterPorts[i], strings.Join(routes, ", "))
}

type jsCluster struct {
	label string            // "js-default" or "js-always"
	nodes []*child          // the three nats-server processes
	urls  map[string]string // server name -> client URL
}

// startJS starts a three-node JetStream cluster, each node a nats-server
// process of its own (see natsNode), storing under dir, and waits until it
// has a meta leader. Port clashes are retried.
func startJS(ctx context.Context, label, dir string, always bool) (*jsCluster, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("this program's path, to start nats-server nodes from: %w", err)
	}
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := startJSOnce(ctx, label, self, filepath.Join(dir, fmt.Sprintf("attempt%d", attempt)), always)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		logf("%s: cluster start failed (attempt %d): %v", label, attempt, err)
	}
	return nil, lastErr
}

func startJSOnce(ctx context.Context, label, self, dir string, always bool) (*jsCluster, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	c := &jsCluster{label: label, urls: map[string]string{}}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			c.stop()
			return nil, err
		}
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(jsConfig(i, ports[i], store, always, ports[3:])), 0o644); err != nil {
			c.stop()
			return nil, err
		}
		// The node checks this too; checking here fails before starting.
		opts, err := server.ProcessConfigFile(conf)
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("config of %s: %w", name, err)
		}
		if opts.SyncAlways != always {
			c.stop()
			return nil, fmt.Errorf("config of %s: SyncAlways is %v, want %v", name, opts.SyncAlways, always)
		}
		p, err := startChild(label+" "+name, self,
			[]string{natsNodeCmd, "-config", conf, "-sync-always=" + strconv.FormatBool(always)},
			filepath.Join(dir, name+".log"))
		if err != nil {
			c.stop()
			return nil, err
		}
		c.nodes = append(c.nodes, p)
		c.urls[name] = fmt.Sprintf("nats://127.0.0.1:%d", ports[i])
	}
	// Wait until every node takes connections and JetStream answers
	// account info (which needs a meta leader).
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, p := range c.nodes {
			if p.exited() {
				c.stop()
				return nil, fmt.Errorf("%s exited during startup\n%s", p.name, logTails(c.nodes, 15))
			}
		}
		err := c.probe(ctx)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("jetstream cluster not ready: %w\n%s", err, logTails(c.nodes, 15))
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			c.stop()
			return nil, err
		}
	}
}

func (c *jsCluster) probe(ctx context.Context) error {
	for name, url := range c.urls {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		nc.Close()
	}
	nc, js, err := c.connect("")
	if err != nil {
		return err
	}
	defer nc.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(cctx)
	return err
}

func (c *jsCluster) allURLs() string {
	var u []string
	for _, url := range c.urls {
		u = append(u, url)
	}
	slices.Sort(u)
	return strings.Join(u, ",")
}

// connect opens a client connection to the named server (all of them if
// name is ""), with a JetStream context.
func (c *jsCluster) connect(name string, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	url := c.urls[name]
	if url == "" {
		url = c.allURLs()
	}
	nc, err := nats.Connect(url, nats.Name("peers-bench"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// stop sends SIGTERM to every node (nats-server shuts down and exits),
// waits up to 10 s, then SIGKILLs.
func (c *jsCluster) stop() {
	if c == nil {
		return
	}
	stopChildren(c.nodes, 10*time.Second)
}

// natsNodeCmd is the hidden sub-command that makes this program one
// nats-server node: `peers nats-node -config FILE [-sync-always]`. It does
// what nats-server's own main does (load the configuration, configure the
// logger, start, wait for shutdown), with nats-server's signal handling:
// SIGTERM shuts it down.
const natsNodeCmd = "nats-node"

func natsNode(args []string) int {
	fs := flag.NewFlagSet(natsNodeCmd, flag.ContinueOnError)
	conf := fs.String("config", "", "nats-server configuration file")
	always := fs.Bool("sync-always", false, "the configuration must set sync_interval: always")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *conf == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "nats-node: want -config FILE and no arguments")
		return 2
	}
	opts, err := server.ProcessConfigFile(*conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-node:", err)
		return 1
	}
	if opts.SyncAlways != *always {
		fmt.Fprintf(os.Stderr, "nats-node: %s: SyncAlways is %v, want %v\n", *conf, opts.SyncAlways, *always)
		return 1
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-node:", err)
		return 1
	}
	s.ConfigureLogger()
	s.Start()
	s.WaitForShutdown()
	return 0
}

// ---- workloads ----

type jsSystem struct {
	c      *jsCluster
	cfg    *config
	always bool
	seq    atomic.Int64
	admin  *nats.Conn
	adminJ jetstream.JetStream
}

func (s *jsSystem) name() string {
	if s.always {
		return "js-always"
	}
	return "js-default"
}

// stream creates a fresh R3 file-storage stream for a workload and waits
// for its leader; it answers the stream's subject and leader server name.
func (s *jsSystem) stream(ctx context.Context, wl string) (name, subject, leader string, err error) {
	if s.admin == nil {
		if s.admin, s.adminJ, err = s.c.connect(""); err != nil {
			return
		}
	}
	n := s.seq.Add(1)
	name = strings.ToUpper(strings.ReplaceAll(fmt.Sprintf("PEERS_%s_%d", wl, n), "-", "_"))
	subject = fmt.Sprintf("peers.%s.%d", wl, n)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := s.adminJ.CreateStream(cctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{subject},
		Storage:  jetstream.FileStorage,
		Replicas: 3,
	})
	if err != nil {
		return "", "", "", fmt.Errorf("create stream: %w", err)
	}
	for {
		info, err := st.Info(cctx)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
			return name, subject, info.Cluster.Leader, nil
		}
		if err := sleepCtx(cctx, 50*time.Millisecond); err != nil {
			return "", "", "", fmt.Errorf("stream %s has no leader: %w", name, err)
		}
	}
}

func (s *jsSystem) dropStream(name string) {
	if s.adminJ == nil || name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.adminJ.DeleteStream(ctx, name)
}

func (s *jsSystem) close() {
	if s.admin != nil {
		s.admin.Close()
	}
}

// publish: publishers goroutines sharing one connection (to the stream
// leader's server), each calling js.Publish and waiting for its PubAck.
func (s *jsSystem) publish(ctx context.Context, wl string, publishers int, idem bool) (*result, error) {
	stream, subject, leader, err := s.stream(ctx, wl)
	if err != nil {
		return nil, err
	}
	defer s.dropStream(stream)
	nc, js, err := s.c.connect(leader)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	body := payload(s.cfg.size)
	var keys atomic.Int64
	prefix := fmt.Sprintf("%s-%d-", stream, time.Now().UnixNano())
	return closedLoop(ctx, publishers, s.cfg.warmup, s.cfg.duration, func(ctx context.Context, _ int) (int, error) {
		var opts []jetstream.PublishOpt
		if idem {
			opts = append(opts, jetstream.WithMsgID(prefix+strconv.FormatInt(keys.Add(1), 10)))
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		ack, err := js.Publish(pctx, subject, body, opts...)
		if err != nil {
			return 0, err
		}
		if ack.Duplicate {
			return 0, errors.New("unique Nats-Msg-Id answered as duplicate")
		}
		return 1, nil
	}), nil
}

// batch: one goroutine calling js.PublishAsync with at most -async-window
// publishes outstanding; a message counts when its PubAck arrives.
func (s *jsSystem) batch(ctx context.Context, wl string) (*result, error) {
	stream, subject, leader, err := s.stream(ctx, wl)
	if err != nil {
		return nil, err
	}
	defer s.dropStream(stream)
	w := newWindow(s.cfg.warmup, s.cfg.duration)
	cpu := cpuBetween(w.start, w.end)
	var acked atomic.Int64
	var errs errCounter
	nc, js, err := s.c.connect(leader,
		jetstream.WithPublishAsyncMaxPending(s.cfg.asyncWindow),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, _ *nats.Msg, _ *jetstream.PubAck) {
			if w.in(time.Now()) {
				acked.Add(1)
			}
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			errs.add(err)
		}),
	)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	body := payload(s.cfg.size)
	for ctx.Err() == nil && time.Now().Before(w.end) {
		if _, err := js.PublishAsync(subject, body, jetstream.WithStallWait(30*time.Second)); err != nil {
			errs.add(err)
			time.Sleep(10 * time.Millisecond)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	r := &result{msgs: acked.Load(), elapsed: s.cfg.duration}
	if d := <-cpu; d > 0 {
		r.cpu = d
	}
	errs.fill(r)
	return r, nil
}

// consume: pre-load, then a durable pull consumer (explicit acks, R3) with
// consumers fetchers, each bound to it with its own pull subscription on a
// connection to the consumer leader's server. Each fetches up to -fetch
// messages waiting up to 1 s and acks every message with AckSync, all of a
// fetch's acks in flight at once, and waits for them. AckSync answers once
// the consumer's Raft group has committed the ack, which is what mqd's ack
// answer means too.
//
// The fetch is nats.go's JetStreamContext pull Fetch: it sends the pull
// request with no_wait and expires, so the server answers as soon as any
// message is available (as mqd's fetch does); the newer jetstream package's
// Fetch waits for the whole batch or the expiry, which at the end of the
// backlog leaves a fetcher idle for the full wait.
func (s *jsSystem) consume(ctx context.Context, wl string, consumers int) (*result, error) {
	stream, subject, _, err := s.stream(ctx, wl)
	if err != nil {
		return nil, err
	}
	defer s.dropStream(stream)
	total := s.cfg.consumeMsgs
	if err := s.preload(ctx, subject, total); err != nil {
		return nil, fmt.Errorf("pre-load: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cons, err := s.adminJ.CreateOrUpdateConsumer(cctx, stream, jetstream.ConsumerConfig{
		Durable:       "bench",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 10000,
		Replicas:      3,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	var leader string
	for leader == "" {
		info, err := cons.Info(cctx)
		if err == nil && info.Cluster != nil {
			leader = info.Cluster.Leader
		}
		if leader == "" {
			if err := sleepCtx(cctx, 50*time.Millisecond); err != nil {
				return nil, fmt.Errorf("consumer has no leader: %w", err)
			}
		}
	}
	nc, _, err := s.c.connect(leader)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	legacy, err := nc.JetStream()
	if err != nil {
		return nil, err
	}
	subs := make(chan *nats.Subscription, consumers)
	for range consumers {
		sub, err := legacy.PullSubscribe(subject, "bench", nats.Bind(stream, "bench"))
		if err != nil {
			return nil, fmt.Errorf("pull subscribe: %w", err)
		}
		defer sub.Unsubscribe()
		subs <- sub
	}
	return consumeLoop(ctx, consumers, total, s.cfg.duration, func(ctx context.Context) (int, error) {
		sub := <-subs
		defer func() { subs <- sub }()
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		msgs, err := sub.Fetch(s.cfg.fetch, nats.Context(fctx))
		cancel()
		if err != nil && len(msgs) == 0 {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
				return 0, nil
			}
			return 0, err
		}
		var ok atomic.Int64
		var first atomic.Value
		var wg sync.WaitGroup
		for _, m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := m.AckSync(nats.Context(actx)); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
				ok.Add(1)
			}()
		}
		wg.Wait()
		if e, _ := first.Load().(error); e != nil {
			return int(ok.Load()), fmt.Errorf("ack: %w", e)
		}
		return int(ok.Load()), nil
	}), nil
}

// preload stores n messages with async publishes, 4096 outstanding.
func (s *jsSystem) preload(ctx context.Context, subject string, n int) error {
	var errs errCounter
	nc, js, err := s.c.connect("",
		jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) { errs.add(err) }))
	if err != nil {
		return err
	}
	defer nc.Close()
	body := payload(s.cfg.size)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if _, err := js.PublishAsync(subject, body, jetstream.WithStallWait(30*time.Second)); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		return errors.New("pre-load acks did not arrive within 60 s")
	case <-ctx.Done():
		return ctx.Err()
	}
	if errs.n.Load() > 0 {
		return errors.New(errs.first.Load().(string))
	}
	return nil
}
