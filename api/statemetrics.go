package api

import (
	"slices"
	"strconv"
	"strings"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	"github.com/mqd/mqd/raftfsm"
)

// The per-topic and per-group series of the state are written straight
// as Prometheus text: a scrape of a large state has hundreds of thousands
// of them, and the registry's way (a metric object with label pairs, then
// a sort and a consistency check per series) cost about 8 µs each. The
// figures are read first (one read transaction), then each family is
// written in one pass, since a family's series must be contiguous; a
// row's label text is written once, into stateRows.labels, and copied
// into each of its families' lines.

type topicRow struct {
	name                  string
	messages, bytes       uint64
	published, duplicates uint64 // this node's publish counters (topicCounters)
	labels                span
}

type groupRow struct {
	topic, name string
	group.Gauges
	group.Tally
	labels span
}

// span is a row's label text in stateRows.labels.
type span struct{ lo, hi int }

// stateFamily is one family of those series: its name, type, help and
// how a row gives its value.
type stateFamily[R any] struct {
	name, typ, help string
	value           func(r *R) uint64
}

var topicFamilies = []stateFamily[topicRow]{
	{"mqd_topic_messages", "gauge", "Retained messages per topic.", func(r *topicRow) uint64 { return r.messages }},
	{"mqd_topic_bytes", "gauge", "Retained payload bytes per topic.", func(r *topicRow) uint64 { return r.bytes }},
	// Counted by this node as leader (0 for a topic without any).
	{"mqd_published_messages_total", "counter",
		"Messages stored by publishes this node committed as leader (duplicates not included).",
		func(r *topicRow) uint64 { return r.published }},
	{"mqd_publish_duplicates_total", "counter",
		"Publishes answered as duplicates (idempotency key or producer sequence) by this node as leader.",
		func(r *topicRow) uint64 { return r.duplicates }},
}

var groupFamilies = []stateFamily[groupRow]{
	{"mqd_group_backlog_messages", "gauge",
		"Messages waiting for delivery to the group: not yet delivered, or waiting for a redelivery (whether or not its backoff has passed).",
		func(r *groupRow) uint64 { return r.Waiting }},
	{"mqd_group_in_flight_messages", "gauge", "Messages leased to the group's consumers and not yet acked.",
		func(r *groupRow) uint64 { return r.InFlight }},
	{"mqd_dlq_messages", "gauge", "Dead letters in the group's dead-letter store.", func(r *groupRow) uint64 { return r.DLQ }},
	{"mqd_group_acked_messages_total", "counter", "Messages the group acked (kept in the replicated state).",
		func(r *groupRow) uint64 { return r.Acked }},
	{"mqd_group_duplicates_skipped_total", "counter",
		"Messages not delivered to the group because it had already processed their idempotency key.",
		func(r *groupRow) uint64 { return r.DuplicatesSkipped }},
	// Counted by this node as it applied (0 for a group without any).
	{"mqd_nacked_messages_total", "counter", "Nacked deliveries (retryable or not) applied.",
		func(r *groupRow) uint64 { return r.Nacked }},
	{"mqd_lease_expiries_total", "counter", "Leases that expired without an ack, applied.",
		func(r *groupRow) uint64 { return r.LeasesExpired }},
	{"mqd_dead_lettered_messages_total", "counter", "Messages moved to a group's dead-letter store.",
		func(r *groupRow) uint64 { return r.DeadLettered }},
	{"mqd_replayed_messages_total", "counter", "Dead letters put back into delivery by a replay.",
		func(r *groupRow) uint64 { return r.Replayed }},
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// appendFamily appends a family's HELP and TYPE lines and one series per
// row (none at all without rows, as the registry does), formatted as the
// registry's text encoder would: label names in order, values as %g.
func appendFamily[R any](b []byte, f *stateFamily[R], rows []R, labels []byte, at func(r *R) span) []byte {
	if len(rows) == 0 {
		return b
	}
	b = append(b, "# HELP "...)
	b = append(b, f.name...)
	b = append(b, ' ')
	b = append(b, helpEscaper.Replace(f.help)...)
	b = append(b, "\n# TYPE "...)
	b = append(b, f.name...)
	b = append(b, ' ')
	b = append(b, f.typ...)
	b = append(b, '\n')
	for i := range rows {
		sp := at(&rows[i])
		b = append(b, f.name...)
		b = append(b, labels[sp.lo:sp.hi]...)
		b = append(b, ' ')
		b = appendValue(b, f.value(&rows[i]))
		b = append(b, '\n')
	}
	return b
}

// appendValue appends v as the registry writes a float64 (%g, shortest):
// below 10^6 that is the integer's digits, from there on an exponent form.
func appendValue(b []byte, v uint64) []byte {
	if v < 1e6 {
		return strconv.AppendUint(b, v, 10)
	}
	return strconv.AppendFloat(b, float64(v), 'g', -1, 64)
}

func topicSpan(r *topicRow) span { return r.labels }
func groupSpan(r *groupRow) span { return r.labels }

// appendLabelValue appends v quoted as a text-format label value. Topic
// and group names never need escaping (mlog.ValidName), but the format
// holds whatever the names.
func appendLabelValue(b []byte, v string) []byte {
	b = append(b, '"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// stateRows are a scrape's figures of the state, in name order, and
// their label text.
type stateRows struct {
	topics []topicRow
	groups []groupRow
	labels []byte
}

// addTopic appends a topic's row and writes its labels.
func (s *stateRows) addTopic(r topicRow) {
	lo := len(s.labels)
	s.labels = appendLabelValue(append(s.labels, `{topic=`...), r.name)
	s.labels = append(s.labels, '}')
	r.labels = span{lo, len(s.labels)}
	s.topics = append(s.topics, r)
}

// addGroup appends a group's row and writes its labels.
func (s *stateRows) addGroup(r groupRow) {
	lo := len(s.labels)
	s.labels = appendLabelValue(append(s.labels, `{group=`...), r.name)
	s.labels = appendLabelValue(append(s.labels, `,topic=`...), r.topic)
	s.labels = append(s.labels, '}')
	r.labels = span{lo, len(s.labels)}
	s.groups = append(s.groups, r)
}

// size estimates the text of the rows' series.
func (s *stateRows) size() int {
	n := 0
	for _, t := range s.topics {
		n += len(topicFamilies) * (t.labels.hi - t.labels.lo + 40)
	}
	for _, g := range s.groups {
		n += len(groupFamilies) * (g.labels.hi - g.labels.lo + 40)
	}
	return n
}

// appendText appends the series of every topic and group family.
func (s *stateRows) appendText(b []byte) []byte {
	for i := range topicFamilies {
		b = appendFamily(b, &topicFamilies[i], s.topics, s.labels, topicSpan)
	}
	for i := range groupFamilies {
		b = appendFamily(b, &groupFamilies[i], s.groups, s.labels, groupSpan)
	}
	return b
}

// stateRows reads every topic's and group's figures, one read transaction
// per state (the default group's and each data group's this node holds:
// counters the FSM keeps; no message is read), with the node's per-group
// sums of applied events and per-topic publish counters. Sums kept for
// groups or topics a state no longer holds are dropped.
func (s *Server) stateRows() *stateRows {
	rows := s.metrics.scrapes.newRows()
	ok := true
	for _, v := range s.heldStates() {
		var err error
		if s.opts.NoGroupSeries {
			err = v.topicRows(rows)
		} else {
			err = v.groupRows(rows)
		}
		ok = ok && err == nil
	}
	s.metrics.published.fill(rows.topics, ok)
	s.metrics.scrapes.sized(rows)
	return rows
}

// heldStates is the node's server and the views of the data groups it
// holds (views.go).
func (s *Server) heldStates() []*Server {
	out := []*Server{s}
	gn, ok := s.grouped()
	if !ok {
		return out
	}
	ids := make([]string, 0)
	for id := range gn.Directory().Groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if v, held := s.view(id); held {
			out = append(out, v)
		}
	}
	return out
}

// groupRows adds this state's topics and groups to rows.
func (s *Server) groupRows(rows *stateRows) error {
	tallies := s.node.GroupTallies()
	var upTo uint64
	err := s.state.Read(func(r *fsm.Reader) error {
		upTo = r.AppliedIndex()
		r.EachTopicGauges(nowMs(), func(t *fsm.TopicGauges) {
			rows.addTopic(topicRow{name: t.Name, messages: t.Messages, bytes: t.Bytes})
			for _, g := range t.Groups {
				k := fsm.TopicGroup{Topic: t.Name, Group: g.Name}
				rows.addGroup(groupRow{topic: t.Name, name: g.Name, Gauges: g.Gauges, Tally: tallies[k].Tally})
				delete(tallies, k)
			}
		})
		return nil
	})
	s.dropTallies(tallies, upTo, err)
	return err
}

// topicRows adds this state's per-topic figures alone to rows
// (Options.NoGroupSeries). The node's sums of groups whose topic the state
// no longer holds are dropped; those of a group deleted from a live topic
// stay (a few words each) until its topic goes.
func (s *Server) topicRows(rows *stateRows) error {
	tallies := s.node.GroupTallies()
	var upTo uint64
	live := map[string]bool{}
	err := s.state.Read(func(r *fsm.Reader) error {
		upTo = r.AppliedIndex()
		r.EachTopicTotals(func(name string, messages, bytes uint64) {
			rows.addTopic(topicRow{name: name, messages: messages, bytes: bytes})
			live[name] = true
		})
		return nil
	})
	for k := range tallies {
		if live[k.Topic] {
			delete(tallies, k)
		}
	}
	s.dropTallies(tallies, upTo, err)
	return err
}

// dropTallies drops the sums of gone groups (what is left of tallies),
// unless the read failed.
func (s *Server) dropTallies(tallies map[fsm.TopicGroup]raftfsm.TallyAt, upTo uint64, err error) {
	if err == nil && len(tallies) > 0 {
		gone := make([]fsm.TopicGroup, 0, len(tallies))
		for k := range tallies {
			gone = append(gone, k)
		}
		s.node.DropGroupTallies(gone, upTo)
	}
}

// newRows answers empty rows with room for as many as the last scrape
// found: growing them row by row copied them a dozen times, a sixth of a
// scrape of 40,000 groups.
func (c *scrapes) newRows() *stateRows {
	c.mu.Lock()
	h := c.hint
	c.mu.Unlock()
	return &stateRows{topics: make([]topicRow, 0, h.topics+h.topics/8), groups: make([]groupRow, 0, h.groups+h.groups/8),
		labels: make([]byte, 0, h.labels+h.labels/8)}
}

// sized records how many rows a scrape found, for the next one.
func (c *scrapes) sized(rows *stateRows) {
	c.mu.Lock()
	c.hint = rowsHint{len(rows.topics), len(rows.groups), len(rows.labels)}
	c.mu.Unlock()
}

// rowsHint is how many rows and label bytes the last scrape found.
type rowsHint struct{ topics, groups, labels int }
