package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
)

// The processing workload: producers in the test publish keyed inputs to
// topic procIn; stage processes (./stage, separate OS processes using the
// Go client) consume them in group procGroup and, for each, publish one
// output to procOut with a process call (or, with Config.ProcessSplit,
// with a publish and then an ack: the broken pattern). A stage nemesis of
// its own SIGKILLs stages and restarts them, and SIGSTOPs them for longer
// than their lease (so that another stage gets the message and the first
// one's process call is refused as stale), while the cluster nemesis runs
// its faults. processcheck.go drains and checks.

const (
	procIn     = "chaos-in"
	procOut    = "chaos-out"
	procGroup  = "stage"
	procAudit  = "audit" // the group on procOut the checker reads it with
	procLease  = time.Second
	procWork   = 150 * time.Millisecond
	procStages = 2
)

// inRec is one input key the producers tried.
type inRec struct {
	key, payload string
	keyed        bool // its output carries an idempotency key
	acked        bool // a publish attempt got a 2xx
	attempts     int
}

// keyProc is what the stages reported for one input key.
type keyProc struct {
	handles    int // deliveries
	processOK  int // process answered 200, not duplicate
	processDup int // process answered 200 duplicate (a retry after a lost answer)
	stale      int // process answered 409 stale_receipt
	publishes  int // -split: publishes answered 2xx
}

// procWorkload runs the producers and the stages of one run.
type procWorkload struct {
	t       *testing.T
	cfg     Config
	nodes   []*tc.Node
	bin     string
	args    []string // the stages' common arguments
	logDir  string
	stopNew atomic.Bool  // producers: no new key
	stopNem atomic.Bool  // stage nemesis: stop
	giveUp  atomic.Int64 // producers: stop retrying after this time (unix ns)
	prodWG  sync.WaitGroup
	nemWG   sync.WaitGroup
	stages  []*stageProc
	across  bool // procIn and procOut live in different data groups

	mu         sync.Mutex
	inputs     map[string]*inRec
	keys       map[string]*keyProc
	events     map[string]int // stage reports by kind, and stage faults
	violations map[string][]string
	anomalies  map[string]int
}

// buildStage builds ./stage into dir.
func buildStage(t *testing.T, dir string) string {
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "chaos-stage")
	cmd := exec.Command("go", "build", "-o", bin, "./test/chaos/stage")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/chaos/stage: %v\n%s", err, out)
	}
	return bin
}

// setupProcess creates the workload's topics and groups (the groups before
// any message, so that retention keeps every message for them).
func setupProcess(ctx context.Context, leader *tc.Node) error {
	topics := map[string]map[string]any{
		procIn:  {"partitions": 3, "max_retry": 1000, "backoff_base_ms": 20, "backoff_max_ms": 300, "backoff_jitter_ms": 20, "ack_timeout_ms": 1000},
		procOut: {"partitions": 3},
	}
	for _, name := range []string{procIn, procOut} {
		if _, err := leader.PutTopic(ctx, name, topics[name]); err != nil {
			return fmt.Errorf("topic %s: %w", name, err)
		}
	}
	for _, tg := range [][2]string{{procIn, procGroup}, {procOut, procAudit}} {
		r, err := leader.Do(ctx, http.MethodPut, groupPath(tg[0], tg[1]), nil, nil)
		if err == nil {
			err = r.Expect(http.StatusCreated, http.StatusOK)
		}
		if err != nil {
			return fmt.Errorf("group %s of %s: %w", tg[1], tg[0], err)
		}
	}
	return nil
}

func newProcWorkload(t *testing.T, cfg Config, nodes []*tc.Node, caPath string) *procWorkload {
	dir := t.TempDir()
	pw := &procWorkload{t: t, cfg: cfg, nodes: nodes, logDir: dir, bin: cfg.StageBinary,
		inputs: map[string]*inRec{}, keys: map[string]*keyProc{}, events: map[string]int{},
		violations: map[string][]string{}, anomalies: map[string]int{}}
	if pw.bin == "" {
		pw.bin = buildStage(t, dir)
	}
	if cfg.Keep != "" {
		t.Cleanup(func() {
			if t.Failed() {
				pw.keepLogs()
			}
		})
	}
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL()
	}
	pw.args = []string{"-servers", strings.Join(urls, ","), "-in", procIn, "-group", procGroup, "-out", procOut,
		"-lease", procLease.String(), "-work", procWork.String()}
	if caPath != "" {
		pw.args = append(pw.args, "-ca", caPath)
	}
	if cfg.ProcessSplit {
		pw.args = append(pw.args, "-split")
	}
	return pw
}

// start starts the stages, the input producers and the stage nemesis.
func (pw *procWorkload) start() {
	for i := range procStages {
		s := &stageProc{pw: pw, name: fmt.Sprintf("stage%d", i+1)}
		pw.stages = append(pw.stages, s)
		if err := s.start(); err != nil {
			pw.t.Fatalf("%s: %v", s.name, err)
		}
	}
	pw.t.Cleanup(pw.killStages)
	for i := range 2 {
		pw.prodWG.Add(1)
		go func() {
			defer pw.prodWG.Done()
			pw.producer(i, rand.New(rand.NewPCG(uint64(pw.cfg.Seed), uint64(5000+i))))
		}()
	}
	pw.nemWG.Add(1)
	go func() {
		defer pw.nemWG.Done()
		pw.nemesis(rand.New(rand.NewPCG(uint64(pw.cfg.Seed), 0x737467)))
	}()
}

func (pw *procWorkload) violation(kind, format string, args ...any) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	pw.violations[kind] = append(pw.violations[kind], fmt.Sprintf(format, args...))
}

func (pw *procWorkload) count(m map[string]int, kind string) {
	pw.mu.Lock()
	m[kind]++
	pw.mu.Unlock()
}

func (pw *procWorkload) do(n *tc.Node, method, path string, body any, hdr map[string]string) (*tc.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), reqTimeout)
	defer cancel()
	if hdr == nil {
		hdr = map[string]string{}
	}
	hdr["Mq-Timeout-Ms"] = brokerTimout
	return n.Do(ctx, method, path, body, hdr)
}

// producer publishes inputs, each retried with its key until a 2xx or the
// end; one in two asks for a keyed output.
func (pw *procWorkload) producer(i int, rng *rand.Rand) {
	for seq := 0; !pw.stopNew.Load(); seq++ {
		key := fmt.Sprintf("s%d-in%d-%06d", pw.cfg.Seed, i, seq)
		mode := "u"
		if rng.IntN(2) == 0 {
			mode = "k"
		}
		rec := &inRec{key: key, keyed: mode == "k", payload: "in|" + key + "|" + mode + "|" + strings.Repeat("y", seq%53)}
		pw.mu.Lock()
		pw.inputs[key] = rec
		pw.mu.Unlock()
		for !pw.publishInput(rng, rec) {
			if g := pw.giveUp.Load(); g != 0 && time.Now().UnixNano() > g {
				break
			}
			sleepRand(rng, 50*time.Millisecond, 250*time.Millisecond)
		}
		sleepRand(rng, pw.cfg.ProducerPause, pw.cfg.ProducerPause*2)
	}
}

func (pw *procWorkload) publishInput(rng *rand.Rand, rec *inRec) bool {
	pw.mu.Lock()
	rec.attempts++
	pw.mu.Unlock()
	r, err := pw.do(pw.nodes[rng.IntN(len(pw.nodes))], http.MethodPost, "/v1/topics/"+procIn+"/messages",
		[]byte(rec.payload), map[string]string{"Idempotency-Key": rec.key})
	switch {
	case err != nil:
		pw.count(pw.anomalies, "input publish: no answer")
		return false
	case r.Status == http.StatusServiceUnavailable:
		pw.count(pw.anomalies, "input publish: 503")
		return false
	case r.Status/100 != 2:
		code, _ := r.CheckError()
		pw.violation("process-unexpected-status", "input publish %s: %d %s", rec.key, r.Status, code)
		return false
	}
	pw.mu.Lock()
	rec.acked = true
	pw.mu.Unlock()
	return true
}

// nemesis kills and pauses stages until stopNem: a SIGKILL and a restart
// after up to 1.5 s, or a SIGSTOP for 1.5 to 4 leases (every message the
// stage holds has its lease run out) and a SIGCONT.
func (pw *procWorkload) nemesis(rng *rand.Rand) {
	for !pw.stopNem.Load() {
		sleepRand(rng, 500*time.Millisecond, 2*time.Second)
		if pw.stopNem.Load() {
			return
		}
		s := pw.stages[rng.IntN(len(pw.stages))]
		if rng.IntN(2) == 0 {
			pw.count(pw.events, "stage-kill")
			s.kill()
			sleepRand(rng, 100*time.Millisecond, 1500*time.Millisecond)
			if err := s.start(); err != nil {
				pw.violation("process-harness", "restart %s: %v", s.name, err)
				return
			}
			continue
		}
		pw.count(pw.events, "stage-pause")
		s.signal(syscall.SIGSTOP)
		sleepRand(rng, procLease*3/2, procLease*4)
		s.signal(syscall.SIGCONT)
	}
}

// halt stops the producers and the stage nemesis at once (a test's end).
func (pw *procWorkload) halt() {
	pw.giveUp.Store(time.Now().UnixNano())
	pw.stopNew.Store(true)
	pw.stopNem.Store(true)
	pw.nemWG.Wait()
	pw.prodWG.Wait()
}

// endFaults tells the producers to start no new key (each retries its
// current one for up to a minute more) and the stage nemesis to stop.
func (pw *procWorkload) endFaults() {
	pw.giveUp.CompareAndSwap(0, time.Now().Add(time.Minute).UnixNano())
	pw.stopNew.Store(true)
	pw.stopNem.Store(true)
}

// stopFaults ends the producers and the stage nemesis (endFaults) and
// leaves every stage running.
func (pw *procWorkload) stopFaults() {
	pw.endFaults()
	pw.nemWG.Wait()
	pw.prodWG.Wait()
	for _, s := range pw.stages {
		s.signal(syscall.SIGCONT)
		if !s.running() {
			if err := s.start(); err != nil {
				pw.violation("process-harness", "restart %s: %v", s.name, err)
			}
		}
	}
}

// keepLogs copies the stages' logs (their stderr, their reports and the
// harness's starts and signals, timestamped) to cfg.Keep/seed-N-stages.
func (pw *procWorkload) keepLogs() {
	dst := filepath.Join(pw.cfg.Keep, fmt.Sprintf("seed-%d-stages", pw.cfg.Seed))
	logs, _ := filepath.Glob(filepath.Join(pw.logDir, "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.MkdirAll(dst, 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dst, filepath.Base(l)), b, 0o644)
		}
		if err != nil {
			pw.t.Logf("keep stage logs: %v", err)
		}
	}
}

func (pw *procWorkload) killStages() {
	for _, s := range pw.stages {
		s.kill()
	}
}

// stageEvent is one line a stage reported.
type stageEvent struct {
	E    string   `json:"e"`
	K    string   `json:"k"`
	Keys []string `json:"keys"`
	St   int      `json:"st"`
	Dup  bool     `json:"dup"`
	Code string   `json:"code"`
	Msg  string   `json:"msg"`
	R    int      `json:"r"`
	Sts  []string `json:"statuses"`
}

func (pw *procWorkload) kp(key string) *keyProc {
	k := pw.keys[key]
	if k == nil {
		k = &keyProc{}
		pw.keys[key] = k
	}
	return k
}

// record takes in one line of a stage's stdout.
func (pw *procWorkload) record(line []byte) {
	var ev stageEvent
	if err := json.Unmarshal(line, &ev); err != nil {
		pw.count(pw.anomalies, "stage: unparsable report line (cut by a SIGKILL)")
		return
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	switch {
	case ev.E == "handle":
		pw.kp(ev.K).handles++
		pw.events["delivery"]++
		if ev.R > 0 {
			pw.events["redelivery"]++
		}
	case ev.E == "process" && ev.St == http.StatusOK:
		for _, k := range ev.Keys {
			if ev.Dup {
				pw.kp(k).processDup++
			} else {
				pw.kp(k).processOK++
			}
		}
		pw.events[map[bool]string{true: "process 200 duplicate", false: "process 200"}[ev.Dup]]++
	case ev.E == "process" && ev.Code == "stale_receipt":
		for _, k := range ev.Keys {
			pw.kp(k).stale++
		}
		pw.events["process 409 stale_receipt"]++
	case ev.E == "publish" && ev.St/100 == 2:
		pw.kp(ev.K).publishes++
		pw.events["split publish 2xx"]++
	case ev.E == "ack" && slices.Contains(ev.Sts, "stale"):
		pw.events["split ack stale"]++
	case ev.E == "error" && strings.Contains(ev.Msg, "lease lost"):
		pw.events["lease lost (extend stale)"]++
	default:
		kind := ev.E
		switch {
		case ev.St != 0 && ev.Code != "":
			kind += fmt.Sprintf(" %d %s", ev.St, ev.Code)
		case ev.St != 0:
			kind += fmt.Sprintf(" %d", ev.St)
		case ev.E != "error":
			kind += " no answer"
		}
		pw.events[kind]++
	}
}

// stageProc is one stage OS process, restarted under the same name.
type stageProc struct {
	pw   *procWorkload
	name string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *stageProc) start() error {
	logf, err := os.OpenFile(filepath.Join(s.pw.logDir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.pw.bin, append(append([]string(nil), s.pw.args...), "-name", s.name)...)
	cmd.Stdout = &lineWriter{fn: func(line []byte) {
		fmt.Fprintf(logf, "%s report %s\n", time.Now().UTC().Format("15:04:05.000"), line)
		s.pw.record(line)
	}}
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		logf.Close()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			s.pw.violation("process-stage-exit", "%s exited by itself: %v (its log: %s)", s.name, err, logf.Name())
		}
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	s.note("started, pid %d", cmd.Process.Pid)
	return nil
}

// note appends a timestamped line of the harness to the stage's log.
func (s *stageProc) note(format string, args ...any) {
	f, err := os.OpenFile(filepath.Join(s.pw.logDir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%s === %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	f.Close()
}

func (s *stageProc) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *stageProc) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil && cmd.Process.Signal(sig) == nil {
		s.note("%v", sig)
	}
}

// kill SIGKILLs the stage and waits (bounded) for it to be reaped.
func (s *stageProc) kill() {
	s.signal(syscall.SIGKILL)
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.pw.violation("process-harness", "%s not reaped 10 s after SIGKILL", s.name)
	}
}

// lineWriter hands each complete line written to it to fn.
type lineWriter struct {
	buf []byte
	fn  func([]byte)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.fn(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}
