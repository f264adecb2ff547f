package api

import (
	"strconv"
	"strings"

	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
)

// The per-topic and per-group series of the state are written straight
// as Prometheus text: a scrape of a large state has hundreds of thousands
// of them, and the registry's way (a metric object with label pairs, then
// a sort and a consistency check per series) cost about 8 µs each. The
// figures are read first (one read transaction), then each family is
// written in one pass, since a family's series must be contiguous.

type topicRow struct {
	name            string
	messages, bytes uint64
}

type groupRow struct {
	topic, name string
	group.Gauges
	group.Tally
}

// stateFamily is one family of those series: its name, type, help and
// how a row gives its value.
type stateFamily[R any] struct {
	name, typ, help string
	value           func(r *R) uint64
}

var topicFamilies = []stateFamily[topicRow]{
	{"mqd_topic_messages", "gauge", "Retained messages per topic.", func(r *topicRow) uint64 { return r.messages }},
	{"mqd_topic_bytes", "gauge", "Retained payload bytes per topic.", func(r *topicRow) uint64 { return r.bytes }},
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
func appendFamily[R any](b []byte, f *stateFamily[R], rows []R, labels func(b []byte, r *R) []byte) []byte {
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
		b = append(b, f.name...)
		b = labels(b, &rows[i])
		b = append(b, ' ')
		b = strconv.AppendFloat(b, float64(f.value(&rows[i])), 'g', -1, 64)
		b = append(b, '\n')
	}
	return b
}

func topicLabels(b []byte, r *topicRow) []byte {
	b = appendLabelValue(append(b, `{topic=`...), r.name)
	return append(b, '}')
}

func groupLabels(b []byte, r *groupRow) []byte {
	b = appendLabelValue(append(b, `{group=`...), r.name)
	b = appendLabelValue(append(b, `,topic=`...), r.topic)
	return append(b, '}')
}

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

// stateRows are a scrape's figures of the state.
type stateRows struct {
	topics []topicRow
	groups []groupRow
}

// size estimates the text of the rows' series.
func (s *stateRows) size() int {
	n := 0
	for _, t := range s.topics {
		n += len(topicFamilies) * (len(t.name) + 48)
	}
	for _, g := range s.groups {
		n += len(groupFamilies) * (len(g.topic) + len(g.name) + 64)
	}
	return n
}

// appendText appends the series of every topic and group family.
func (s *stateRows) appendText(b []byte) []byte {
	for i := range topicFamilies {
		b = appendFamily(b, &topicFamilies[i], s.topics, topicLabels)
	}
	for i := range groupFamilies {
		b = appendFamily(b, &groupFamilies[i], s.groups, groupLabels)
	}
	return b
}

// stateRows reads every topic's and group's figures in one read
// transaction (counters the FSM keeps; no message is read), with the
// node's per-group sums of applied events. Sums kept for groups the state
// no longer holds are dropped.
func (s *Server) stateRows() *stateRows {
	tallies := s.node.GroupTallies()
	rows := &stateRows{}
	var upTo uint64
	err := s.state.Read(func(r *fsm.Reader) error {
		upTo = r.AppliedIndex()
		r.EachTopicGauges(nowMs(), func(t *fsm.TopicGauges) {
			rows.topics = append(rows.topics, topicRow{name: t.Name, messages: t.Messages, bytes: t.Bytes})
			for _, g := range t.Groups {
				k := fsm.TopicGroup{Topic: t.Name, Group: g.Name}
				rows.groups = append(rows.groups, groupRow{topic: t.Name, name: g.Name, Gauges: g.Gauges, Tally: tallies[k].Tally})
				delete(tallies, k)
			}
		})
		return nil
	})
	if err == nil && len(tallies) > 0 {
		gone := make([]fsm.TopicGroup, 0, len(tallies))
		for k := range tallies {
			gone = append(gone, k)
		}
		s.node.DropGroupTallies(gone, upTo)
	}
	return rows
}
