package systest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	tc "github.com/mqd/mqd/internal/testcluster"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape reads a node's /metrics into metric families.
func Scrape(ctx context.Context, t testing.TB, n *tc.Node) map[string]*dto.MetricFamily {
	t.Helper()
	r, err := n.Do(ctx, "GET", "/metrics", nil, nil)
	if err == nil {
		err = r.Expect(200)
	}
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return fams
}

// Sample is the value of the family's series whose labels include want.
func MetricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		ok := true
		for k, v := range want {
			if !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// MetricSample reads one sample of n's /metrics: the line that starts with
// series (name and labels, as printed). Absent: 0.
func MetricSample(ctx context.Context, n *tc.Node, series string) (float64, error) {
	r, err := n.Do(ctx, http.MethodGet, "/metrics", nil, nil)
	if err != nil {
		return 0, err
	}
	if err := r.Expect(http.StatusOK); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, nil
}

// StatusKB reads a field of /proc/PID/status in bytes.
func StatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
