package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"unicode/utf8"
)

func init() {
	register(&command{name: "peek", args: "TOPIC", summary: "show stored messages without consuming them (no group, no lease, no delivery counted)",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			part := fs.Uint("partition", 0, "only this partition (default: every partition in turn)")
			off := fs.Uint64("offset", 0, "start at this offset (with --partition; default its first retained message)")
			count := fs.Int("count", 10, "show at most this many messages")
			stale := fs.Bool("stale", false, "read the answering node's own state, also without a leader (may be behind)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "TOPIC"); err != nil {
					return err
				}
				pk := peek{topic: args[0], count: *count, only: isSet(fs, "partition"), part: uint32(*part), stale: *stale}
				if isSet(fs, "offset") {
					if !pk.only {
						return usageErr("--offset needs --partition (an offset is a position in one partition)")
					}
					pk.off = off
				}
				if *count < 1 {
					return usageErr("--count must be at least 1")
				}
				return pk.run(ctx, c)
			}
		}})
}

// peek walks GET /v1/topics/{topic}/messages page by page.
type peek struct {
	topic string
	count int
	only  bool // --partition given
	part  uint32
	off   *uint64
	stale bool   // ?stale=ok
	ageMs string // Mq-Stale-Ms of the last stale answer
}

type peekPage struct {
	Messages      []json.RawMessage `json:"messages"`
	NextPartition uint32            `json:"next_partition"`
	NextOffset    uint64            `json:"next_offset"`
	More          bool              `json:"more"`
}

type peekMessage struct {
	Partition      uint32            `json:"partition"`
	Offset         uint64            `json:"offset"`
	ValueB64       string            `json:"value_b64"`
	IdempotencyKey string            `json:"idempotency_key"`
	PublishedAt    string            `json:"published_at"`
	Attrs          map[string]string `json:"attrs"`
}

func (pk *peek) run(ctx context.Context, c *cli) error {
	parts := pk.part + 1
	if !pk.only {
		var t struct {
			Partitions []json.RawMessage `json:"partitions"`
		}
		if err := pk.get(ctx, c, "", nil, &t); err != nil {
			return err
		}
		parts = uint32(len(t.Partitions))
	}
	w := c.table()
	if !c.json {
		fmt.Fprintln(w, "PARTITION\tOFFSET\tKEY\tPUBLISHED AT\tVALUE")
	}
	shown := 0
	p, off := pk.part, pk.off
	for shown < pk.count && p < parts {
		pg, err := pk.page(ctx, c, p, off, pk.count-shown)
		if err != nil {
			return err
		}
		for _, raw := range pg.Messages {
			if err := pk.print(c, w, raw); err != nil {
				return err
			}
			shown++
		}
		off = &pg.NextOffset
		if !pg.More {
			p, off = p+1, nil // this partition is read to its end
		}
	}
	if !c.json {
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(c.stderr, "%d message(s) shown; nothing was consumed\n", shown)
		if pk.stale {
			fmt.Fprintf(c.stderr, "read from the answering node's own state, which may be %s ms behind the leader's\n", pk.ageMs)
		}
	}
	return nil
}

func (pk *peek) page(ctx context.Context, c *cli, p uint32, off *uint64, n int) (*peekPage, error) {
	q := url.Values{"partition": {strconv.FormatUint(uint64(p), 10)}, "limit": {strconv.Itoa(min(n, 1000))}}
	if off != nil {
		q.Set("offset", strconv.FormatUint(*off, 10))
	}
	var pg peekPage
	if err := pk.get(ctx, c, "/messages", q, &pg); err != nil {
		return nil, err
	}
	return &pg, nil
}

// get reads the topic's path suffix with query q into out.
func (pk *peek) get(ctx context.Context, c *cli, suffix string, q url.Values, out any) error {
	if pk.stale {
		if q == nil {
			q = url.Values{}
		}
		q.Set("stale", "ok")
	}
	path := "/v1/topics/" + url.PathEscape(pk.topic) + suffix
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.client.Do(ctx, "GET", path, nil)
	if err != nil {
		return err
	}
	pk.ageMs = resp.Header.Get("Mq-Stale-Ms")
	if err := json.Unmarshal(resp.Body, out); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	return nil
}

func (pk *peek) print(c *cli, w interface{ Write([]byte) (int, error) }, raw json.RawMessage) error {
	if c.json {
		c.printJSON(raw)
		return nil
	}
	var m peekMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("decoding a message: %w", err)
	}
	v, err := base64.StdEncoding.DecodeString(m.ValueB64)
	if err != nil {
		return fmt.Errorf("decoding a message's value: %w", err)
	}
	val := string(v)
	if !utf8.Valid(v) {
		val = "base64:" + m.ValueB64
	}
	_, err = fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\n", m.Partition, m.Offset, m.IdempotencyKey, m.PublishedAt, oneLine(val))
	return err
}
