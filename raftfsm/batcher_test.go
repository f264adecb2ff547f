package raftfsm

import (
	"bytes"
	"testing"

	mlog "github.com/mqd/mqd/log"
)

// packEntries keeps the order, covers every command once, puts commands
// together up to entryBytes and a larger command in an entry of its own.
func TestPackEntries(t *testing.T) {
	pub := func(size int) *pending {
		enc := (&Command{Op: OpPublish, Topic: "t",
			Msgs: []mlog.Placed{{Msg: &mlog.Message{Value: bytes.Repeat([]byte("x"), size)}}}}).Encode()
		return &pending{enc: enc}
	}
	var batch []*pending
	sizes := []int{1000, 1000, entryBytes, 1000, entryBytes / 2, entryBytes / 2, 10}
	for _, n := range sizes {
		batch = append(batch, pub(n))
	}
	entries := packEntries(batch)
	next := 0
	for i, e := range entries {
		if e.first != next || e.n < 1 {
			t.Fatalf("entry %d covers [%d, %d), want to start at %d", i, e.first, e.first+e.n, next)
		}
		next = e.first + e.n
		c, err := DecodeCommand(e.data)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		switch {
		case e.n == 1 && c.Op != OpPublish, e.n > 1 && (c.Op != OpMulti || len(c.Batch) != e.n):
			t.Fatalf("entry %d of %d commands decodes as %s with %d", i, e.n, c.Op, len(c.Batch))
		case e.n > 1 && len(e.data) > entryBytes+64:
			t.Errorf("entry %d of %d commands is %d bytes, over %d", i, e.n, len(e.data), entryBytes)
		}
		if e.n > 1 {
			for j, sub := range c.Batch {
				if want := sizes[e.first+j]; len(sub.Msgs[0].Msg.Value) != want {
					t.Errorf("entry %d command %d has a %d-byte value, want %d (order)", i, j, len(sub.Msgs[0].Msg.Value), want)
				}
			}
		}
	}
	if next != len(batch) {
		t.Fatalf("entries cover %d of %d commands", next, len(batch))
	}
	// 1000+1000 | entryBytes | 1000+half | half+10
	if len(entries) != 4 || entries[0].n != 2 || entries[1].n != 1 || entries[2].n != 2 || entries[3].n != 2 {
		t.Errorf("entries %v, want sizes 2, 1, 2, 2", func() (ns []int) {
			for _, e := range entries {
				ns = append(ns, e.n)
			}
			return
		}())
	}
}
