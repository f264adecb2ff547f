package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
	dto "github.com/prometheus/client_model/go"
)

// The families SPEC §7 names exist with their types, labels and values
// that follow what was done; labels stay bounded (route patterns, never
// paths); mqd_raft_state is 1 on one series.
func TestMetricsFamilies(t *testing.T) {
	t.Parallel()
	// fsm.db's checkpoint stays where the node opened, so the kill below
	// always rolls it back there and raft replays every entry since (with
	// the default 1 s interval, how many it replays depends on timing);
	// the clean restart first makes that checkpoint hold some state.
	c := tc.Start(t, 1, tc.WithEnv(fsm.TestCheckpointIntervalEnv+"=1h"))
	n := c.Node(0)
	ctx := tc.CtxFor(t, 60*time.Second)
	tc.MustTopic(t, n, "metrics-t", map[string]any{"max_retry": 0})
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		tc.MustPublish(t, n, "metrics-t", fmt.Sprintf("m%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("k%d", i)})
	}
	tc.MustPublish(t, n, "metrics-t", "m0 again", map[string]string{"Idempotency-Key": "k0"})
	msgs, _, err := n.Fetch(ctx, "metrics-t", "g1", tc.FetchRequest{Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("fetch: %d messages, %v", len(msgs), err)
	}
	if _, _, err := n.Ack(ctx, "metrics-t", "g1", []string{msgs[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Nack(ctx, "metrics-t", "g1", []string{msgs[1].Receipt}, map[string]any{"reason": "boom"}); err != nil {
		t.Fatal(err)
	}
	fams := systest.Scrape(ctx, t, n)

	types := map[string]dto.MetricType{
		"mqd_published_messages_total":     dto.MetricType_COUNTER,
		"mqd_publish_duplicates_total":     dto.MetricType_COUNTER,
		"mqd_group_backlog_messages":       dto.MetricType_GAUGE,
		"mqd_group_in_flight_messages":     dto.MetricType_GAUGE,
		"mqd_dlq_messages":                 dto.MetricType_GAUGE,
		"mqd_raft_state":                   dto.MetricType_GAUGE,
		"mqd_raft_commit_index":            dto.MetricType_GAUGE,
		"mqd_raft_applied_index":           dto.MetricType_GAUGE,
		"mqd_publish_commit_seconds":       dto.MetricType_HISTOGRAM,
		"mqd_http_requests_total":          dto.MetricType_COUNTER,
		"mqd_http_request_seconds":         dto.MetricType_HISTOGRAM,
		"mqd_raft_commit_seconds":          dto.MetricType_HISTOGRAM,
		"mqd_raft_apply_seconds":           dto.MetricType_HISTOGRAM,
		"mqd_raft_leader_changes_total":    dto.MetricType_COUNTER,
		"mqd_raft_snapshots_total":         dto.MetricType_COUNTER,
		"mqd_raft_snapshot_seconds":        dto.MetricType_HISTOGRAM,
		"mqd_raft_snapshot_bytes":          dto.MetricType_GAUGE,
		"mqd_lease_expiries_total":         dto.MetricType_COUNTER,
		"mqd_nacked_messages_total":        dto.MetricType_COUNTER,
		"mqd_dead_lettered_messages_total": dto.MetricType_COUNTER,
		"mqd_timing_wheel_timers":          dto.MetricType_GAUGE,
		"mqd_state_format":                 dto.MetricType_GAUGE,
		"go_goroutines":                    dto.MetricType_GAUGE,
		"process_resident_memory_bytes":    dto.MetricType_GAUGE,
	}
	for name, typ := range types {
		f := fams[name]
		if f == nil {
			t.Errorf("/metrics lacks %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want %v", name, f.GetType(), typ)
		}
	}
	tg := map[string]string{"topic": "metrics-t", "group": "g1"}
	for _, want := range []struct {
		name   string
		labels map[string]string
		v      float64
	}{
		{"mqd_published_messages_total", map[string]string{"topic": "metrics-t"}, 3},
		{"mqd_publish_duplicates_total", map[string]string{"topic": "metrics-t"}, 1},
		{"mqd_group_backlog_messages", tg, 1},
		{"mqd_group_in_flight_messages", tg, 0},
		{"mqd_dlq_messages", tg, 1},
		{"mqd_nacked_messages_total", tg, 1},
		{"mqd_dead_lettered_messages_total", tg, 1},
		{"mqd_group_acked_messages_total", tg, 1},
		{"mqd_raft_state", map[string]string{"state": "leader", "raft_group": "default"}, 1},
		// Four: the repeat of k0 is proposed and committed too (the FSM
		// answers it as a duplicate; the leader has no pre-check).
		{"mqd_publish_commit_seconds", nil, 4},
		{"mqd_http_requests_total", map[string]string{"route": "/v1/topics/{topic}/messages", "code": "201"}, 3},
		{"mqd_http_requests_total", map[string]string{"route": "/v1/topics/{topic}/messages", "code": "200"}, 1},
		{"mqd_http_request_seconds", map[string]string{"route": "/v1/topics/{topic}/groups/{group}/fetch"}, 1},
	} {
		got, ok := systest.MetricValue(fams, want.name, want.labels)
		if !ok || got != want.v {
			t.Errorf("%s%v = %v (present %v), want %v", want.name, want.labels, got, ok, want.v)
		}
	}
	var ones int
	for _, m := range fams["mqd_raft_state"].GetMetric() {
		ones += int(m.GetGauge().GetValue())
	}
	if ones != 1 {
		t.Errorf("mqd_raft_state has %d series at 1, want exactly one", ones)
	}
	// The per-group gauges agree with the topic stats (backlog there is
	// split into backlog and delayed).
	st, err := n.Stats(ctx, "metrics-t")
	if err != nil {
		t.Fatal(err)
	}
	now := systest.Scrape(ctx, t, n)
	gs := st.Groups["g1"]
	if v, _ := systest.MetricValue(now, "mqd_group_backlog_messages", tg); v != float64(gs.Backlog+gs.Delayed) {
		t.Errorf("mqd_group_backlog_messages = %v, stats say backlog %d + delayed %d", v, gs.Backlog, gs.Delayed)
	}
	// A lease that expires is counted (and, with max_retry 0, dead-lettered);
	// a replayed dead letter is counted.
	if _, _, err := n.Fetch(ctx, "metrics-t", "g2", tc.FetchRequest{Max: 1, LeaseMs: 200}); err != nil {
		t.Fatal(err)
	}
	tg2 := map[string]string{"topic": "metrics-t", "group": "g2"}
	pollMetric(ctx, t, n, "mqd_lease_expiries_total", tg2, 1)
	pollMetric(ctx, t, n, "mqd_dead_lettered_messages_total", tg2, 1)
	if r, err := n.Do(ctx, "POST", "/v1/topics/metrics-t/groups/g1/dlq/replay", map[string]any{"all": true}, nil); err != nil || r.Status != 200 {
		t.Fatalf("replay: %v %+v", err, r)
	}
	pollMetric(ctx, t, n, "mqd_replayed_messages_total", tg, 1)
	pollMetric(ctx, t, n, "mqd_dlq_messages", tg, 0)

	// A restart replays the log into the state: what was counted before
	// must not be counted again (the counters restart from 0, the gauges
	// keep the state's figures).
	n.Kill()
	n.Restart()
	if err := n.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	after := systest.Scrape(ctx, t, n)
	if v, _ := systest.MetricValue(after, "mqd_nacked_messages_total", tg); v != 0 {
		t.Errorf("after a restart mqd_nacked_messages_total = %v, want 0 (the replayed log was counted again)", v)
	}
	if v, _ := systest.MetricValue(after, "mqd_dlq_messages", tg2); v != 1 {
		t.Errorf("after a restart mqd_dlq_messages{g2} = %v, want 1", v)
	}
	for _, name := range []string{"mqd_http_requests_total", "mqd_http_request_seconds"} {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.Label {
				if l.GetName() == "route" && strings.Contains(l.GetValue(), "metrics-t") {
					t.Errorf("%s has a path, not a route pattern, as its route label: %q", name, l.GetValue())
				}
			}
		}
	}
	// A deleted group's series leave every per-group family, the node's
	// own counters (lease expiries) included.
	if r, err := n.Do(ctx, "DELETE", "/v1/topics/metrics-t/groups/g2", nil, nil); err != nil || r.Status != 200 {
		t.Fatalf("delete group g2: %v %+v", err, r)
	}
	for name, f := range systest.Scrape(ctx, t, n) {
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == "group" && l.GetValue() == "g2" }) {
				t.Errorf("%s still has a series of the deleted group g2", name)
			}
		}
	}
	// A deleted topic's series leave every family.
	if r, err := n.Do(ctx, "DELETE", "/v1/topics/metrics-t", nil, nil); err != nil || r.Status != 200 {
		t.Fatalf("delete topic: %v %+v", err, r)
	}
	for name, f := range systest.Scrape(ctx, t, n) {
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == "topic" && l.GetValue() == "metrics-t" }) {
				t.Errorf("%s still has a series of the deleted topic", name)
			}
		}
	}
}

// pollMetric waits (bounded by ctx and 20 s) until a node's metric has the
// Value want.
func pollMetric(ctx context.Context, t *testing.T, n *tc.Node, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, _ := systest.MetricValue(systest.Scrape(ctx, t, n), name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after 20 s, want %v", name, labels, got, want)
		}
		if err := systest.Pause(ctx, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

// promIdent finds the metric names in a PromQL expression: every family
// mqd exposes starts with mqd_, go_ or process_, and no label name does.
var promIdent = regexp.MustCompile(`\b(?:mqd|go|process)_[A-Za-z0-9_:]*`)

// dashboardExprs returns every PromQL expression in the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	root, err := tc.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string
		Targets []struct{ Expr string }
		Panels  []json.RawMessage
	}
	var d struct {
		Title  string
		Panels []panel
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	var out []string
	for _, p := range d.Panels {
		if p.Title == "" {
			t.Errorf("a dashboard panel has no title")
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// Every PromQL expression of docs/grafana-dashboard.json references only
// metric families a real node exposes on /metrics (histogram series by
// their _bucket/_sum/_count names), and references at least one.
func TestGrafanaDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	exprs := dashboardExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("the dashboard has %d expressions; expected a full dashboard", len(exprs))
	}
	c := tc.Start(t, 1)
	n := c.Node(0)
	ctx := tc.CtxFor(t, 30*time.Second)
	// Per-group families appear once a group exists.
	tc.MustTopic(t, n, "dash", nil)
	tc.MustPublish(t, n, "dash", "x", nil)
	if _, _, err := n.Fetch(ctx, "dash", "g", tc.FetchRequest{Max: 1}); err != nil {
		t.Fatal(err)
	}
	fams := systest.Scrape(ctx, t, n)
	exists := func(name string) bool {
		if fams[name] != nil {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok {
				if f := fams[base]; f != nil && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
					return true
				}
			}
		}
		return false
	}
	quoted := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	for _, e := range exprs {
		names := promIdent.FindAllString(quoted.ReplaceAllString(e, `""`), -1)
		if len(names) == 0 {
			t.Errorf("expression references no metric: %s", e)
		}
		for _, name := range names {
			if !exists(name) {
				t.Errorf("dashboard references %s, which /metrics does not expose: %s", name, e)
			}
		}
	}
}
