package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mqd/mqd/client"
)

// attrFlags collects repeated --attr k=v.
type attrFlags map[string]string

func (a attrFlags) String() string { return "" }
func (a attrFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want name=value, got %q", s)
	}
	a[k] = v
	return nil
}

func init() {
	register(&command{name: "pub", args: "TOPIC [MESSAGE]",
		summary: "publish MESSAGE, or each line of --file or stdin; prints each position",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			key := fs.String("key", "", "Idempotency-Key; with several messages, line N gets KEY-N (so re-running a file publishes nothing twice)")
			pkey := fs.String("partition-key", "", "Mq-Partition-Key: the same key goes to the same partition")
			delay := fs.Duration("delay", 0, "deliver no sooner than this from now (e.g. 30s)")
			file := fs.String("file", "", "publish each non-empty line of this file (- for stdin)")
			attrs := attrFlags{}
			fs.Var(attrs, "attr", "attribute name=value, returned on delivery (repeatable)")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) < 1 || len(args) > 2 {
					return usageErr("want TOPIC [MESSAGE]")
				}
				if *delay < 0 {
					return usageErr("--delay must not be negative")
				}
				o := client.PublishOptions{PartitionKey: *pkey, Delay: *delay, Attrs: attrs}
				if len(args) == 2 {
					if *file != "" {
						return usageErr("give MESSAGE or --file, not both")
					}
					o.IdempotencyKey = *key
					return publishOne(ctx, c, args[0], []byte(args[1]), o)
				}
				in := c.stdin
				if *file == "" && isTerminal(in) {
					fmt.Fprintln(c.stderr, "mqd pub: one message per line; end with Ctrl-D")
				}
				if *file != "" && *file != "-" {
					f, err := os.Open(*file)
					if err != nil {
						return err
					}
					defer f.Close()
					in = f
				}
				return publishLines(ctx, c, args[0], in, *key, o)
			}
		}})
}

func publishOne(ctx context.Context, c *cli, topic string, value []byte, o client.PublishOptions) error {
	r, err := c.client.Publish(ctx, topic, value, o)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(r.Raw)
		return nil
	}
	dup := ""
	if r.Duplicate {
		dup = " duplicate"
	}
	fmt.Fprintf(c.stdout, "%s partition %d offset %d%s\n", r.Topic, r.Partition, r.Offset, dup)
	return nil
}

// publishLines publishes each non-empty line of in, one after the other,
// and stops at the first error.
func publishLines(ctx context.Context, c *cli, topic string, in io.Reader, key string, o client.PublishOptions) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 17<<20)
	n := 0
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSuffix(sc.Text(), "\r")
		if text == "" {
			continue
		}
		if key != "" {
			o.IdempotencyKey = key + "-" + strconv.Itoa(line)
		}
		if err := publishOne(ctx, c, topic, []byte(text), o); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading messages: %w", err)
	}
	if n == 0 {
		return usageErr("no message given (an argument, --file, or lines on stdin)")
	}
	return nil
}

func init() {
	register(&command{name: "sub", longRunning: true, args: "TOPIC --group G",
		summary: "fetch messages, print each value on a line (JSON with --json), ack them",
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			grp := fs.String("group", "", "consumer group (required)")
			count := fs.Int("count", 0, "stop after this many messages (0: no limit)")
			wait := fs.Duration("wait", 2*time.Second, "stop when no message arrives for this long (0: take what is there now)")
			follow := fs.Bool("follow", false, "keep waiting for messages until interrupted (ignores --wait)")
			nack := fs.String("nack", "", "nack each delivery with this reason instead of acking it (it comes back after its backoff, and is nacked again if that is within --wait)")
			noAck := fs.Bool("no-ack", false, "leave the messages leased: they are delivered again when the lease runs out")
			lease := fs.Duration("lease", 0, "lease length (default: the topic's ack_timeout_ms)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := needArgs(args, 1, "TOPIC"); err != nil {
					return err
				}
				if *grp == "" {
					return usageErr("--group is required")
				}
				if *count < 0 || *wait < 0 || *lease < 0 {
					return usageErr("--count, --wait and --lease must not be negative")
				}
				if *nack != "" && *noAck {
					return usageErr("--nack and --no-ack exclude each other")
				}
				s := subscriber{c: c, topic: args[0], group: *grp, count: *count, wait: *wait, follow: *follow,
					nack: *nack, noAck: *noAck, lease: *lease}
				err := s.run(ctx)
				s.summary()
				return err
			}
		}})
}

type subscriber struct {
	c                  *cli
	topic, group, nack string
	count              int
	wait, lease        time.Duration
	follow, noAck      bool
	received           int
	settled, stale     int // receipts acked or nacked, and those the lease had ended for
}

// summary says on stderr what the run did with the messages it printed.
func (s *subscriber) summary() {
	verb := "acked"
	switch {
	case s.noAck:
		fmt.Fprintf(s.c.stderr, "mqd sub: received %d, left leased (--no-ack: delivered again when the lease runs out)\n", s.received)
		return
	case s.nack != "":
		verb = "nacked"
	}
	line := fmt.Sprintf("mqd sub: received %d, %s %d", s.received, verb, s.settled)
	if s.stale > 0 {
		line += fmt.Sprintf(", %d stale (the lease had ended)", s.stale)
	}
	fmt.Fprintln(s.c.stderr, line)
}

func (s *subscriber) run(ctx context.Context) error {
	for s.count == 0 || s.received < s.count {
		batch := 100
		if s.count > 0 {
			batch = min(batch, s.count-s.received)
		}
		wait := s.wait
		if s.follow {
			wait = 30 * time.Second
		}
		msgs, err := s.c.client.Fetch(ctx, s.topic, s.group, client.FetchOptions{Max: batch, Wait: wait, Lease: s.lease})
		if ctx.Err() != nil {
			return nil // interrupted
		}
		if err != nil {
			return err
		}
		if len(msgs) == 0 && !s.follow {
			return nil
		}
		if err := s.print(msgs); err != nil {
			return err
		}
		if err := s.settle(ctx, msgs); err != nil {
			return err
		}
		s.received += len(msgs)
	}
	return nil
}

func (s *subscriber) print(msgs []client.Message) error {
	w := bufio.NewWriter(s.c.stdout)
	for _, m := range msgs {
		if s.c.json {
			w.Write(trimNL(m.Raw))
		} else {
			w.Write(m.Value)
		}
		w.WriteByte('\n')
	}
	return w.Flush()
}

// settle acks or nacks msgs (unless --no-ack), even after an interrupt:
// what was printed counts as handled.
func (s *subscriber) settle(ctx context.Context, msgs []client.Message) error {
	if s.noAck || len(msgs) == 0 {
		return nil
	}
	receipts := make([]string, len(msgs))
	for i, m := range msgs {
		receipts[i] = m.Receipt
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), client.DefaultTimeout)
	defer cancel()
	var res []client.ReceiptResult
	var err error
	if s.nack != "" {
		res, err = s.c.client.Nack(sctx, s.topic, s.group, client.NackOptions{Reason: s.nack}, receipts...)
	} else {
		res, err = s.c.client.Ack(sctx, s.topic, s.group, receipts...)
	}
	if err != nil {
		return err
	}
	for i, r := range res {
		if r.Status == client.StatusOK {
			s.settled++
		} else {
			s.stale++
			fmt.Fprintf(s.c.stderr, "mqd: %s/%d@%d: receipt %s (the lease had ended; it may be delivered again)\n",
				msgs[i].Topic, msgs[i].Partition, msgs[i].Offset, r.Status)
		}
	}
	return nil
}
