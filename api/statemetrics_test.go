package api

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqd/mqd/group"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// The state's series, written straight as text, are byte for byte what
// the registry's encoder writes for the same families, label values and
// values (including label values that need escaping, large values, and no
// family at all without rows).
func TestStateTextMatchesRegistry(t *testing.T) {
	rows := &stateRows{}
	rows.addTopic(topicRow{name: "a", messages: 3, bytes: 1 << 40, published: 999999, duplicates: 1000000})
	rows.addTopic(topicRow{name: "b.c-d_e", published: 1<<64 - 1})
	for _, g := range []groupRow{
		{topic: "a", name: "g1", Gauges: group.Gauges{Waiting: 1234567, InFlight: 1, DLQ: 2, Acked: 1 << 53, DuplicatesSkipped: 7},
			Tally: group.Tally{Nacked: 5, LeasesExpired: 6, DeadLettered: 8, Replayed: 9}},
		{topic: "a", name: "g2"},
		{topic: `q"u\o` + "\nte", name: `x\y`},
	} {
		rows.addGroup(g)
	}
	reg := prometheus.NewRegistry()
	add := func(name, typ, help string, labels []string, set func(v *prometheus.GaugeVec, c *prometheus.CounterVec)) {
		if typ == "gauge" {
			v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
			reg.MustRegister(v)
			set(v, nil)
			return
		}
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		set(nil, c)
	}
	put := func(v *prometheus.GaugeVec, c *prometheus.CounterVec, x uint64, lv ...string) {
		if v != nil {
			v.WithLabelValues(lv...).Set(float64(x))
		} else {
			c.WithLabelValues(lv...).Add(float64(x))
		}
	}
	for _, f := range topicFamilies {
		add(f.name, f.typ, f.help, []string{"topic"}, func(v *prometheus.GaugeVec, c *prometheus.CounterVec) {
			for i := range rows.topics {
				put(v, c, f.value(&rows.topics[i]), rows.topics[i].name)
			}
		})
	}
	for _, f := range groupFamilies {
		add(f.name, f.typ, f.help, []string{"topic", "group"}, func(v *prometheus.GaugeVec, c *prometheus.CounterVec) {
			for i := range rows.groups {
				put(v, c, f.value(&rows.groups[i]), rows.groups[i].topic, rows.groups[i].name)
			}
		})
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// The registry sorts families by name and series by label values; the
	// rows come in that order from the state (names in byte order).
	want := map[string][]byte{}
	for _, mf := range mfs {
		var b bytes.Buffer
		if err := expfmt.NewEncoder(&b, textFormat).Encode(mf); err != nil {
			t.Fatal(err)
		}
		want[mf.GetName()] = b.Bytes()
	}
	got := rows.appendText(nil)
	for _, name := range append(familyNames(topicFamilies), familyNames(groupFamilies)...) {
		w := want[name]
		i := bytes.Index(got, []byte("# HELP "+name+" "))
		if i < 0 || !bytes.HasPrefix(got[i:], w) {
			end := min(len(got), i+len(w))
			t.Errorf("%s:\ngot  %q\nwant %q", name, got[max(i, 0):max(end, 0)], w)
		}
	}
	if n := len(bytes.Split(bytes.TrimSpace(got), []byte("\n"))); n != 4*(2+2)+9*(2+3) {
		t.Errorf("%d lines, want %d", n, 4*(2+2)+9*(2+3))
	}
	if out := (&stateRows{}).appendText(nil); len(out) != 0 {
		t.Errorf("no topics: %q, want nothing (no family without series)", out)
	}
}

func familyNames[R any](fs []stateFamily[R]) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.name
	}
	return out
}

// Scrapes that arrive while a body is being built wait for the next build
// and share it: six scrapes, the first one's build held until five more
// wait, make two builds, and the five get the second (built after they
// arrived), not the first.
func TestScrapesShareTheNextBuild(t *testing.T) {
	var c scrapes
	var builds atomic.Int32
	release := make(chan struct{})
	fn := func() ([]byte, error) {
		n := builds.Add(1)
		if n == 1 {
			<-release
		}
		return []byte{byte(n)}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan []byte, 1)
	go func() {
		b, _ := c.get(ctx, fn)
		first <- b
	}()
	for builds.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	got := make(chan []byte, 5)
	for range 5 {
		go func() {
			b, _ := c.get(ctx, fn)
			got <- b
		}()
	}
	// All five wait on the running build (none can start one meanwhile).
	for deadline := time.Now().Add(5 * time.Second); ; {
		c.mu.Lock()
		waiting := c.waiting
		c.mu.Unlock()
		if waiting == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d scrapes wait for the running build after 5 s, want 5", waiting)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if b := <-first; !bytes.Equal(b, []byte{1}) {
		t.Errorf("first scrape got build %v, want 1", b)
	}
	for range 5 {
		if b := <-got; !bytes.Equal(b, []byte{2}) {
			t.Errorf("a scrape that arrived during build 1 got build %v, want 2", b)
		}
	}
	if n := builds.Load(); n != 2 {
		t.Errorf("%d builds for 6 scrapes, want 2", n)
	}
}

// Without per-group series (--metrics-group-series=false) a scrape has
// every topic's series and no group's; with them, every group's.
func TestNoGroupSeries(t *testing.T) {
	f := stateOf(t, 3, 2)
	for _, off := range []bool{false, true} {
		s := newServer(scrapeNode{}, f, slog.New(slog.DiscardHandler), Options{NoGroupSeries: off})
		body := string(s.stateRows().appendText(nil))
		if n := strings.Count(body, "\nmqd_topic_messages{"); n != 3 {
			t.Errorf("group series off=%v: %d mqd_topic_messages series, want 3", off, n)
		}
		want := 6
		if off {
			want = 0
		}
		if n := strings.Count(body, "\nmqd_group_in_flight_messages{"); n != want {
			t.Errorf("group series off=%v: %d mqd_group_in_flight_messages series, want %d", off, n, want)
		}
	}
}
