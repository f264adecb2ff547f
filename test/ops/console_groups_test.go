package ops

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// pageDataGroup is one row of the console's data-group table.
type pageDataGroup struct {
	ID        string   `json:"id"`
	Members   []string `json:"members"`
	Preferred []string `json:"preferred"`
	Leader    string   `json:"leader"`
	Topics    string   `json:"topics"`
}

// readPageGroups reads the console's data-group table in one step.
const readPageGroups = `[...document.querySelectorAll("#data-groups tbody tr")].map((tr) => ({
  id: tr.dataset.groupId,
  members: [...tr.querySelectorAll("span.member")].map((s) => s.dataset.member),
  preferred: [...tr.querySelectorAll("span.member.preferred")].map((s) => s.dataset.member),
  leader: tr.querySelector("td.group-leader .state.leader") ? tr.querySelector("td.group-leader .state.leader").textContent : "",
  topics: tr.cells[3].textContent,
}))`

// TestConsoleDataGroups drives the console against a three-node
// --data-groups cluster: the cluster page lists each data group with its
// members (the preferred leader marked), its leader and its topic count
// as GET /v1/cluster reports them; the topic list shows each topic's raft
// group and leader as GET /v1/topics/{topic} places it, and a topic whose
// group has no replica on the answering node is listed with the stats a
// member of its group reads (GET /v1/topics asks it), and, selected, shows
// its stats and replicas loaded through a member. Before
// this change the page showed no data group and no placement.
func TestConsoleDataGroups(t *testing.T) {
	t.Parallel()
	exe := systest.Chromium(t)
	c := tc.Start(t, 3, tc.WithFlags("--data-groups"))
	nodes := c.Nodes()
	n := nodes[0]
	topics := []string{"ui-dg-a", "ui-dg-b", "ui-dg-c"}
	for i, tp := range topics {
		tc.MustTopic(t, nodes[i], tp, map[string]any{"partitions": 2})
	}
	systest.WaitSpread(t, n, topics)
	// Two single-replica topics: the first goes to n1's group of one, the
	// second to n2's, which n1 (the page's node) holds no replica of.
	solo := []string{"ui-solo-1", "ui-solo-2"}
	for _, tp := range solo {
		tc.MustTopic(t, nodes[2], tp, map[string]any{"replicas": 1})
	}
	ctx := tc.CtxFor(t, 120*time.Second)
	// GET /v1/topics is answered by the metadata leader, with the stats
	// of the groups it holds: away is a single-replica topic it does not.
	meta := tc.MustLeader(t, c).ID()
	away, awayHeld := "", ""
	for _, tp := range solo {
		_, _, reps, err := systest.TopicPlacement(ctx, n, tp)
		if err != nil || len(reps) != 1 {
			t.Fatalf("topic %s: replicas %v %v, want 1", tp, reps, err)
		}
		if reps[0] != meta {
			away, awayHeld = tp, reps[0]
		}
	}
	if away == "" {
		t.Fatalf("both single-replica topics are on the metadata leader %s; want one elsewhere", meta)
	}
	for i, tp := range append(slices.Clone(topics), away) {
		for k := range i + 1 {
			if _, err := systest.PublishRetry(ctx, nodes, tp, fmt.Sprintf("%s-%d", tp, k)); err != nil {
				t.Fatalf("publish to %s: %v", tp, err)
			}
		}
	}

	b := systest.Browser(t, exe, 100*time.Second)
	problems := systest.WatchConsole(t, b)
	defer problems.Check(t)
	if err := chromedp.Do(b, chromedp.Navigate(n.URL()+"/ui"), chromedp.WaitVisible(`#data-groups tbody tr`)); err != nil {
		t.Fatalf("open the console and see its data groups: %v", err)
	}

	// The page and the API agree, and name every group's leader (read
	// both until they do: a leader may still be handing over to its
	// group's preferred one).
	var api []systest.ClusterDataGroup
	var page []pageDataGroup
	same := func() bool {
		r, err := n.Do(ctx, http.MethodGet, "/v1/cluster", nil, nil)
		var ci struct {
			Groups []systest.ClusterDataGroup `json:"groups"`
		}
		if err == nil {
			err = r.JSON(&ci)
		}
		if err != nil {
			t.Fatalf("GET /v1/cluster: %v", err)
		}
		api = ci.Groups
		page = systest.MustRun(t, b, chromedp.Evaluate[[]pageDataGroup](readPageGroups))
		if len(api) != len(page) {
			return false
		}
		for i, g := range api {
			p := page[i]
			if g.Leader == "" || p.ID != g.ID || !slices.Equal(p.Members, g.Members) || p.Leader != g.Leader || p.Topics != fmt.Sprint(g.Topics) ||
				!slices.Equal(p.Preferred, g.Members[:1]) {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(20 * time.Second); !same(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			a, _ := json.Marshal(api)
			p, _ := json.Marshal(page)
			t.Fatalf("the console's data groups %s, GET /v1/cluster %s", p, a)
		}
	}
	// Three groups of three (one per voter) and two of one; each of the
	// three-member groups led by the node it prefers, a different one each.
	leaders := map[string]bool{}
	known := 0
	for _, g := range api {
		if g.Leader != "" {
			known++
		}
		if len(g.Members) == 3 {
			leaders[g.Leader] = true
		}
	}
	if len(api) != 5 || len(leaders) != 3 || known != 5 {
		t.Fatalf("GET /v1/cluster groups %+v: want 5 groups, three of three led by 3 nodes, every leader known to %s", api, n)
	}
	t.Logf("the console shows the data groups %+v", page)

	// Each topic's row: its raft group and leader as its placement says
	// (away's too: the metadata leader, which answers the list, knows the
	// leader of a group it holds no replica of).
	for _, tp := range append(slices.Clone(topics), solo...) {
		g, l, _, err := systest.TopicPlacement(ctx, n, tp)
		if err != nil {
			t.Fatal(err)
		}
		row := `#topic-table tr[data-topic="` + tp + `"]`
		systest.WaitText(t, b, row+` td.raft-group`, g)
		systest.WaitText(t, b, row+` td.topic-leader`, l)
	}
	// The topic held elsewhere: its stats in the list, as a member of its
	// group reads them (before, "—": the metadata leader holds no replica);
	// selected, its stats and replicas come through a member of its group.
	row := `#topic-table tr[data-topic="` + away + `"]`
	systest.WaitText(t, b, row+` td:nth-child(3)`, "4") // the list refreshes every few seconds
	if f := strings.Fields(systest.TextOf(t, b, row)); len(f) < 3 || f[1] != "1" || f[2] != "4" {
		t.Errorf("the row of %s, held elsewhere: %q, want its stats: 1 partition, 4 messages", away, f)
	}
	if err := chromedp.Do(b, chromedp.Click(row), chromedp.WaitVisible(`#topic-detail`)); err != nil {
		t.Fatal(err)
	}
	systest.WaitText(t, b, `#topic-facts`, "4\nmessages")
	if got := systest.TextOf(t, b, `#topic-placement .member.leader`); got != awayHeld+" leader" {
		t.Errorf("topic %s's replicas: the console marks %q as leader, want %s", away, got, awayHeld)
	}
	systest.WaitText(t, b, row+` td.topic-leader`, awayHeld)
	if err := chromedp.Do(b, chromedp.WaitVisible(`#browse-table tr[data-pos="0/3"]`)); err != nil {
		t.Errorf("browse %s through the console: %v", away, err)
	}
	if s := systest.TextOf(t, b, `#banner`); s != "" {
		t.Errorf("the console's banner says %q", s)
	}
	if f := strings.Fields(systest.TextOf(t, b, row)); len(f) < 3 || f[1] != "1" || f[2] != "4" {
		t.Errorf("the row of %s once selected: %q, want 1 partition, 4 messages", away, f)
	}
	systest.Screenshot(t, b)
}
