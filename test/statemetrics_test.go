package test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
	dto "github.com/prometheus/client_model/go"
)

// The state's series on /metrics are the figures the API answers, on
// every node of a three-node cluster: per topic, retained messages and
// bytes (and the leader's publish counters); per group, backlog (backlog
// plus delayed), in flight, dead letters, acked, duplicates skipped; one
// series per topic and per group, none more. The figures are also the
// ones the test made (30 + 7 stored, 2 duplicates, 6 + 5 + 5 acked, 2
// dead, 2 + 2 in flight), so that the two reads cannot agree on a wrong count.
func TestStateMetricsMatchAPI(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	ctx := tc.CtxFor(t, 90*time.Second)
	l := tc.MustLeader(t, c)
	tc.MustTopic(t, l, "sm-a", map[string]any{"partitions": 3, "max_retry": 0})
	tc.MustTopic(t, l, "sm-b", nil)
	tc.MustTopic(t, l, "sm-c", map[string]any{"partitions": 2})
	for i := range 30 {
		tc.MustPublish(t, l, "sm-a", fmt.Sprintf("a%d", i), map[string]string{"Idempotency-Key": fmt.Sprintf("k%d", i)})
	}
	for i := range 2 {
		if pr := tc.MustPublish(t, l, "sm-a", "again", map[string]string{"Idempotency-Key": fmt.Sprintf("k%d", i)}); !pr.Duplicate {
			t.Fatalf("publish of k%d again: %+v, want a duplicate", i, pr)
		}
	}
	for i := range 7 {
		tc.MustPublish(t, l, "sm-b", fmt.Sprintf("b-%d", i), nil)
	}
	// sm-a/g1: 6 acked, 2 dead-lettered (max_retry 0), 2 in flight, 20
	// never delivered; sm-a/g2: 5 acked; sm-a/g3: created, untouched;
	// sm-b/g1: 5 acked, 2 in flight.
	consume(ctx, t, l, "sm-a", "g1", 10, 6, 2)
	consume(ctx, t, l, "sm-a", "g2", 5, 5, 0)
	if r, err := l.Do(ctx, "PUT", "/v1/topics/sm-a/groups/g3", nil, nil); err != nil || r.Expect(200, 201) != nil {
		t.Fatalf("PUT group g3: %v %+v", err, r)
	}
	consume(ctx, t, l, "sm-b", "g1", 7, 5, 0)

	// What the test did, so that a figure wrong in both reads fails too
	// (sm-b's messages are not here: the 5 its only group acked are
	// trimmed in the background).
	want := apiSeries(ctx, t, l)
	for fam, v := range map[string]map[string]float64{
		"mqd_topic_messages":             {"topic=sm-a": 30, "topic=sm-c": 0},
		"mqd_group_backlog_messages":     {"group=g1,topic=sm-a": 20, "group=g2,topic=sm-a": 25, "group=g1,topic=sm-b": 0},
		"mqd_group_in_flight_messages":   {"group=g1,topic=sm-a": 2, "group=g2,topic=sm-a": 0, "group=g1,topic=sm-b": 2},
		"mqd_dlq_messages":               {"group=g1,topic=sm-a": 2},
		"mqd_group_acked_messages_total": {"group=g1,topic=sm-a": 6, "group=g2,topic=sm-a": 5, "group=g1,topic=sm-b": 5},
	} {
		for labels, x := range v {
			if got := want[fam][labels]; got != x {
				t.Fatalf("the API says %s{%s} = %v, want %v: the test's own arithmetic is off", fam, labels, got, x)
			}
		}
	}
	for _, n := range c.Nodes() {
		// This node's publish counters: the leader stored and answered
		// duplicates, the followers none.
		pub, dup := map[string]float64{}, map[string]float64{}
		for _, topic := range []string{"sm-a", "sm-b", "sm-c"} {
			pub["topic="+topic], dup["topic="+topic] = 0, 0
		}
		if n == l {
			pub["topic=sm-a"], pub["topic=sm-b"], dup["topic=sm-a"] = 30, 7, 2
		}
		pollStateSeries(ctx, t, n, func() map[string]map[string]float64 {
			w := apiSeries(ctx, t, l)
			w["mqd_published_messages_total"], w["mqd_publish_duplicates_total"] = pub, dup
			return w
		})
	}
}

// apiSeries are the state's series as the leader's GET /v1/topics/{topic}
// gives them, by family and label text.
func apiSeries(ctx context.Context, t *testing.T, l *tc.Node) map[string]map[string]float64 {
	t.Helper()
	want := map[string]map[string]float64{}
	put := func(fam, labels string, v int64) {
		if want[fam] == nil {
			want[fam] = map[string]float64{}
		}
		want[fam][labels] = float64(v)
	}
	for _, topic := range []string{"sm-a", "sm-b", "sm-c"} {
		st, err := l.Stats(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		tl := "topic=" + topic
		put("mqd_topic_messages", tl, st.Messages)
		put("mqd_topic_bytes", tl, st.Bytes)
		for name, g := range st.Groups {
			gl := "group=" + name + "," + tl
			put("mqd_group_backlog_messages", gl, g.Backlog+g.Delayed)
			put("mqd_group_in_flight_messages", gl, g.InFlight)
			put("mqd_dlq_messages", gl, g.DLQ)
			put("mqd_group_acked_messages_total", gl, g.Acked)
			put("mqd_group_duplicates_skipped_total", gl, g.DuplicatesSkipped)
		}
	}
	return want
}

// consume fetches n messages of topic for group (a 5-minute lease), acks
// the first acks of them and nacks the next nacks; the rest stay in flight.
func consume(ctx context.Context, t *testing.T, n *tc.Node, topic, group string, fetch, acks, nacks int) {
	t.Helper()
	var receipts []string
	for deadline := time.Now().Add(20 * time.Second); len(receipts) < fetch; {
		msgs, _, err := n.Fetch(ctx, topic, group, tc.FetchRequest{Max: fetch - len(receipts), LeaseMs: 300_000})
		if err != nil {
			t.Fatalf("fetch %s/%s: %v", topic, group, err)
		}
		for _, m := range msgs {
			receipts = append(receipts, m.Receipt)
		}
		if time.Now().After(deadline) {
			t.Fatalf("fetch %s/%s: %d messages after 20 s, want %d", topic, group, len(receipts), fetch)
		}
	}
	if acks > 0 {
		if _, _, err := n.Ack(ctx, topic, group, receipts[:acks]); err != nil {
			t.Fatal(err)
		}
	}
	if nacks > 0 {
		if _, _, err := n.Nack(ctx, topic, group, receipts[acks:acks+nacks], map[string]any{"reason": "boom"}); err != nil {
			t.Fatal(err)
		}
	}
}

// pollStateSeries scrapes n until every family of what want answers has
// exactly those series and values, and fails with the differences after
// 20 s. want is asked again each time: a follower applies a little after
// the leader, and a background trim changes the figures.
func pollStateSeries(ctx context.Context, t *testing.T, n *tc.Node, wantNow func() map[string]map[string]float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		want := wantNow()
		fams := systest.Scrape(ctx, t, n)
		var diffs []string
		for _, fam := range slices.Sorted(maps.Keys(want)) {
			got := seriesOf(fams[fam])
			for labels, v := range want[fam] {
				if g, ok := got[labels]; !ok || g != v {
					diffs = append(diffs, fmt.Sprintf("%s{%s} = %v (present %v), want %v", fam, labels, g, ok, v))
				}
			}
			for labels := range got {
				if _, ok := want[fam][labels]; !ok {
					diffs = append(diffs, fmt.Sprintf("%s{%s}: a series of no topic or group", fam, labels))
				}
			}
		}
		if len(diffs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s /metrics after 20 s:\n%s", n, slices.Sorted(slices.Values(diffs)))
		}
		if err := systest.Pause(ctx, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

// seriesOf maps a family's series, by their labels as "k=v,k=v" in the
// order the text gave them, to their values.
func seriesOf(f *dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		var labels string
		for i, lp := range m.GetLabel() {
			if i > 0 {
				labels += ","
			}
			labels += lp.GetName() + "=" + lp.GetValue()
		}
		if m.Counter != nil {
			out[labels] = m.Counter.GetValue()
		} else {
			out[labels] = m.Gauge.GetValue()
		}
	}
	return out
}
