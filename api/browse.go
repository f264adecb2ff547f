package api

import (
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

// Limits of a browse page (GET /v1/topics/{topic}/messages).
const (
	browseDefault = 100
	browseMax     = 1000
	// browseMaxBytes ends a page early once its values add up to it (a
	// page always holds at least one message).
	browseMaxBytes = 4 << 20
)

// browsedMessage is a fetched message's JSON without its receipt: a
// browse reads the log, not a group, so retry_count is 0 and
// reject_reason empty.
type browsedMessage struct {
	Topic          string            `json:"topic"`
	Partition      uint32            `json:"partition"`
	Offset         uint64            `json:"offset"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	RetryCount     uint32            `json:"retry_count"`
	MaxRetry       int64             `json:"max_retry"`
	RejectReason   string            `json:"reject_reason"`
	PublishedAt    string            `json:"published_at"`
	Attrs          map[string]string `json:"attrs"`
}

type browsePage struct {
	Messages      []browsedMessage `json:"messages"`
	NextPartition uint32           `json:"next_partition"`
	NextOffset    uint64           `json:"next_offset"`
	More          bool             `json:"more"`
}

// browse answers a page of a topic's stored messages in (partition,
// offset) order from ?partition= (default 0) and ?offset= (default the
// partition's first retained), ?limit= of them (1..1000, default 100).
// With ?partition= the page stays in that partition; without, it goes on
// into the following partitions. next_partition and next_offset are the
// ?partition= and ?offset= of the next page. Nothing is leased or written.
func (s *Server) browse(ctx *fasthttp.RequestCtx, r *route) error {
	q := ctx.QueryArgs()
	limit, err := queryUint(ctx, "limit", browseDefault, 1, browseMax)
	if err != nil {
		return err
	}
	part, err := queryUint(ctx, "partition", 0, 0, mlog.MaxPartitions-1)
	if err != nil {
		return err
	}
	off, err := queryUint(ctx, "offset", 0, 0, 1<<63-1)
	if err != nil {
		return err
	}
	only := q.Has("partition")
	if q.Has("offset") && !only {
		return fmt.Errorf("%w: offset needs partition (an offset is a position in one partition)", ErrBadRequest)
	}
	var pg *fsm.BrowsePage
	err = s.state.Read(func(rd *fsm.Reader) error {
		var err error
		pg, err = rd.Browse(r.topic, uint32(part), off, int(limit), browseMaxBytes, only)
		return err
	})
	if errors.Is(err, fsm.ErrBadPartition) {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if err != nil {
		return err
	}
	out := browsePage{Messages: make([]browsedMessage, len(pg.Messages)), NextPartition: pg.NextPartition,
		NextOffset: pg.NextOffset, More: pg.More}
	for i, b := range pg.Messages {
		m := b.Msg
		out.Messages[i] = browsedMessage{Topic: r.topic, Partition: b.Partition, Offset: m.Offset,
			ValueB64: base64.StdEncoding.EncodeToString(m.Value), IdempotencyKey: m.IdempotencyKey,
			MaxRetry: m.MaxRetry, PublishedAt: rfc3339ms(m.PublishedAt), Attrs: attrsMap(m.Attrs)}
	}
	writeJSON(ctx, 200, out)
	return nil
}
