package fsm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mqd/mqd/command"
	mlog "github.com/mqd/mqd/log"
)

// Browse pages through partitions in (partition, offset) order: the
// position after a page, whether more is stored past it, a page pinned to
// one partition, the byte bound, an offset past the end, a partition the
// topic lacks; MaxRetry comes resolved. (A page full at a partition's end
// said "no more" when the next partition was empty and a later one was
// not, before storedFrom.)
func TestReaderBrowse(t *testing.T) {
	h := mustFSM(t)
	three := uint32(3)
	h.must(&command.Command{Op: command.OpPutTopic, Topic: "a", Patch: mlog.Patch{Partitions: &three}})
	h.must(publish(1, "a", keyed(0, "k0", "p0o0"), keyed(0, "", "p0o1"), keyed(0, "", "p0o2"), keyed(2, "", "p2o0"), keyed(2, "", "p2o1")))
	const big = 1 << 20
	type want struct {
		got        string
		part       uint32
		off        uint64
		more       bool
		badPartErr bool
	}
	cases := []struct {
		name      string
		part      uint32
		off       uint64
		limit, mb int
		only      bool
		want      want
	}{
		{"first page", 0, 0, 2, big, false, want{"p0o0 p0o1", 0, 2, true, false}},
		{"across the empty partition", 0, 2, 2, big, false, want{"p0o2 p2o0", 2, 1, true, false}},
		{"full at a partition's end", 0, 2, 1, big, false, want{"p0o2", 1, 0, true, false}},
		{"to the end", 0, 0, 10, big, false, want{"p0o0 p0o1 p0o2 p2o0 p2o1", 2, 2, false, false}},
		{"one partition", 0, 1, 10, big, true, want{"p0o1 p0o2", 0, 3, false, false}},
		{"the empty one", 1, 0, 10, big, true, want{"", 1, 0, false, false}},
		{"byte bound", 0, 0, 10, 1, false, want{"p0o0", 0, 1, true, false}},
		{"past the end", 2, 10, 5, big, true, want{"", 2, 10, false, false}},
		{"no such partition", 3, 0, 5, big, false, want{badPartErr: true}},
	}
	for _, c := range cases {
		mustRead(t, h.f, func(r *Reader) error {
			pg, err := r.Browse("a", c.part, c.off, c.limit, c.mb, c.only)
			if c.want.badPartErr {
				if !errors.Is(err, ErrBadPartition) {
					t.Errorf("%s: %v, want ErrBadPartition", c.name, err)
				}
				return nil
			}
			if err != nil {
				return err
			}
			got := ""
			for i, m := range pg.Messages {
				if i > 0 {
					got += " "
				}
				got += string(m.Msg.Value)
				if want := fmt.Sprintf("p%do%d", m.Partition, m.Msg.Offset); string(m.Msg.Value) != want {
					t.Errorf("%s: message %s at %s", c.name, m.Msg.Value, want)
				}
				if m.Msg.MaxRetry != 5 {
					t.Errorf("%s: MaxRetry %d, want the topic's 5", c.name, m.Msg.MaxRetry)
				}
			}
			w := c.want
			if got != w.got || pg.NextPartition != w.part || pg.NextOffset != w.off || pg.More != w.more {
				t.Errorf("%s: %q next %d/%d more %v; want %q next %d/%d more %v", c.name, got, pg.NextPartition, pg.NextOffset, pg.More,
					w.got, w.part, w.off, w.more)
			}
			return nil
		})
	}
	mustRead(t, h.f, func(r *Reader) error {
		_, err := r.Browse("nope", 0, 0, 1, big, false)
		if !errors.Is(err, mlog.ErrTopicNotFound) {
			t.Errorf("unknown topic: %v", err)
		}
		return nil
	})
}
