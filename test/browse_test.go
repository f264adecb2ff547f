package test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/fsm"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

func browse(t *testing.T, n *tc.Node, topic, query string) systest.BrowsePage {
	t.Helper()
	r, err := n.Do(tc.CtxFor(t, 15*time.Second), "GET", "/v1/topics/"+topic+"/messages?"+query, nil, nil)
	if err != nil {
		t.Fatalf("browse %s?%s via %s: %v", topic, query, n, err)
	}
	if err := r.Expect(200); err != nil {
		t.Fatalf("browse %s?%s via %s: %v", topic, query, n, err)
	}
	var pg systest.BrowsePage
	if err := r.JSON(&pg); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(r.Body), `"receipt"`) {
		t.Errorf("browse answers a receipt: %s", r.Body)
	}
	return pg
}

// The state browsing must leave alone: the topic's and its groups' figures
// (through the leader) and the raft commit index.
type browseView struct {
	stats  tc.TopicStats
	commit uint64
}

func viewOf(t *testing.T, l *tc.Node, topic string) browseView {
	t.Helper()
	ctx := tc.CtxFor(t, 15*time.Second)
	st, err := l.Stats(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := l.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return browseView{st, ci.CommitIndex}
}

// TestBrowseChangesNothing: GET /v1/topics/{topic}/messages and `mqd peek`,
// through a follower, read every stored message in (partition, offset)
// order, page by page, without leasing, creating a group, counting a
// delivery or writing a raft entry; bad parameters are 400s. On the code
// before the route, the GET answers 405 and `mqd peek` is an unknown
// command.
func TestBrowseChangesNothing(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 3)
	l, fs := tc.MustRoles(t, c)
	f := fs[0]
	settled(t, l)
	tc.MustTopic(t, l, "browse", map[string]any{"partitions": 3, "ack_timeout_ms": 600000})
	want := map[string]string{} // "p/o" -> value
	for i := range 25 {
		v := fmt.Sprintf("v%02d", i)
		pr := tc.MustPublish(t, f, "browse", v, map[string]string{"Idempotency-Key": "k" + v, "Mq-Attr-N": v})
		want[fmt.Sprintf("%d/%d", pr.Partition, pr.Offset)] = v
	}
	// A group with a message in flight and one acked, so that a lease or a
	// delivery counted by browsing would show in its figures.
	msgs, _, err := l.Fetch(tc.CtxFor(t, 15*time.Second), "browse", "g", tc.FetchRequest{Max: 2, LeaseMs: 600000})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("fetch: %v (%d messages)", err, len(msgs))
	}
	if _, _, err := l.Ack(tc.CtxFor(t, 15*time.Second), "browse", "g", []string{msgs[0].Receipt}); err != nil {
		t.Fatal(err)
	}
	// Acked by every group and at its partition's head, the message is
	// trimmed (retention "until acked") by a raft entry of the leader's:
	// wait for it, so that the entries counted below are browsing's only.
	if _, err := systest.PollStats(tc.CtxFor(t, 30*time.Second), l, "browse", func(st tc.TopicStats) bool { return st.Messages == 24 }); err != nil {
		t.Fatalf("the acked head was not trimmed: %v", err)
	}
	delete(want, fmt.Sprintf("%d/%d", msgs[0].Partition, msgs[0].Offset))
	tc.WaitApplied(t, c)
	before := viewOf(t, l, "browse")

	// Every partition in turn, four messages a page.
	seen := map[string]string{}
	for p := range 3 {
		q := fmt.Sprintf("partition=%d&limit=4", p)
		prev := int64(-1)
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatalf("partition %d: no end after 20 pages", p)
			}
			pg := browse(t, f, "browse", q)
			for _, m := range pg.Messages {
				if m.Partition != p || m.Offset <= prev {
					t.Fatalf("partition %d page %d: message %d/%d out of order", p, pages, m.Partition, m.Offset)
				}
				prev = m.Offset
				v, _ := m.Value()
				if m.Attrs["n"] != string(v) || m.IdempotencyKey != "k"+string(v) || m.RetryCount != 0 || m.PublishedAt == "" {
					t.Errorf("message %d/%d: %+v", m.Partition, m.Offset, m)
				}
				seen[fmt.Sprintf("%d/%d", m.Partition, m.Offset)] = string(v)
			}
			if pg.NextPartition != p || (len(pg.Messages) > 0 && pg.NextOffset != prev+1) {
				t.Fatalf("partition %d: continue at %d/%d after offset %d", p, pg.NextPartition, pg.NextOffset, prev)
			}
			if !pg.More {
				break
			}
			q = fmt.Sprintf("partition=%d&offset=%d&limit=4", p, pg.NextOffset)
		}
	}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("browsed %v, stored %v", seen, want)
	}
	// Without partition: one page from partition 0 on, across partitions.
	all := browse(t, f, "browse", "limit=1000")
	if len(all.Messages) != 24 || all.More {
		t.Errorf("one page of everything: %d messages, more %v", len(all.Messages), all.More)
	}
	for i := 1; i < len(all.Messages); i++ {
		a, b := all.Messages[i-1], all.Messages[i]
		if a.Partition > b.Partition || a.Partition == b.Partition && a.Offset >= b.Offset {
			t.Errorf("message %d (%d/%d) after %d/%d", i, b.Partition, b.Offset, a.Partition, a.Offset)
		}
	}
	// mqd peek walks the same messages through the binary.
	out := systest.OK(t, f.URL(), "", "peek", "browse", "--count", "100", "--json")
	if n := strings.Count(out, "\n"); n != 24 {
		t.Errorf("mqd peek --count 100 --json printed %d lines, want 24:\n%s", n, out)
	}
	out = systest.OK(t, f.URL(), "", "peek", "browse", "--partition", "1", "--offset", "1", "--count", "2")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], "1 ") {
		t.Errorf("mqd peek --partition 1 --offset 1 --count 2:\n%s", out)
	}
	checkBrowseRefusals(t, f)
	tc.WaitApplied(t, c)
	if after := viewOf(t, l, "browse"); !reflect.DeepEqual(before, after) {
		t.Errorf("browsing changed the state:\nbefore %+v\nafter  %+v", before, after)
	}
}

func checkBrowseRefusals(t *testing.T, n *tc.Node) {
	t.Helper()
	for _, q := range []string{"limit=0", "limit=1001", "partition=3", "partition=x", "offset=1", "partition=-1",
		"offset=1x&partition=0", "stale=yes", "group=g", "limit=1&limit=2"} {
		r, err := n.Do(tc.CtxFor(t, 15*time.Second), "GET", "/v1/topics/browse/messages?"+q, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code, err := r.CheckError(); r.Status != 400 || err != nil {
			t.Errorf("?%s: %d %s %v, want 400", q, r.Status, code, err)
		}
	}
	r, err := n.Do(tc.CtxFor(t, 15*time.Second), "GET", "/v1/topics/nosuch/messages", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := r.CheckError(); r.Status != 404 || code != "topic_not_found" {
		t.Errorf("unknown topic: %d %s", r.Status, code)
	}
	if r := systest.RunCLI(t, n.URL(), "", "peek", "browse", "--offset", "3"); r.Code != 2 {
		t.Errorf("mqd peek --offset without --partition: exit %d, want 2 (%s)", r.Code, r.Stderr)
	}
}

// settled waits until the cluster's own start-up entries are written
// (every member's addresses recorded, the state format raised), so that a
// test can count the raft entries its requests write.
func settled(t *testing.T, l *tc.Node) {
	t.Helper()
	_, err := tc.WaitView(tc.CtxFor(t, 30*time.Second), l, "state format raised and every address", func(ci tc.ClusterInfo) bool {
		ok := ci.StateFormat == fsm.StateFormat && len(ci.Nodes) == 3
		for _, n := range ci.Nodes {
			ok = ok && n.HTTPAddr != ""
		}
		return ok
	})
	if err != nil {
		t.Fatal(err)
	}
}
