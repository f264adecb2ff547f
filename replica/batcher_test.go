package replica

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
)

// packEntries keeps the order, covers every command once, puts commands
// together up to entryBytes and a larger command in an entry of its own.
func TestPackEntries(t *testing.T) {
	pub := func(size int) *pending {
		enc := (&command.Command{Op: command.OpPublish, Topic: "t",
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
		c, err := command.Decode(e.data)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		switch {
		case e.n == 1 && c.Op != command.OpPublish, e.n > 1 && (c.Op != command.OpMulti || len(c.Batch) != e.n):
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

// TestRecycledEncodingsLeaveEntriesAlone: the encodings recycleCopied gives
// back are reused by later commands, and no entry's data changes: neither
// an OpMulti (a copy) nor a command alone in its entry (its own encoding,
// which is never given back).
func TestRecycledEncodingsLeaveEntriesAlone(t *testing.T) {
	pub := func(fill byte) *pending {
		c := &command.Command{Op: command.OpPublish, Topic: "t",
			Msgs: []mlog.Placed{{Msg: &mlog.Message{Value: bytes.Repeat([]byte{fill}, 1000)}}}}
		enc, buf := c.EncodePooled()
		return &pending{enc: enc, buf: buf}
	}
	value := func(t *testing.T, data []byte) []byte {
		t.Helper()
		c, err := command.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if c.Op == command.OpMulti {
			c = c.Batch[0]
		}
		return c.Msgs[0].Msg.Value
	}
	alone := []*pending{pub('a')}
	aloneEntries := packEntries(alone)
	recycleCopied(alone, aloneEntries)
	multi := []*pending{pub('b'), pub('b'), pub('b')}
	given := map[*byte]bool{}
	for _, p := range multi {
		given[&p.enc[:1][0]] = true
	}
	multiEntries := packEntries(multi)
	recycleCopied(multi, multiEntries)
	if len(aloneEntries) != 1 || aloneEntries[0].n != 1 || len(multiEntries) != 1 || multiEntries[0].n != 3 {
		t.Fatalf("entries: %+v, %+v", aloneEntries, multiEntries)
	}
	reused := 0
	for range 100 {
		later := []*pending{pub('z'), pub('z')}
		for _, p := range later {
			if given[&p.enc[:1][0]] {
				reused++
			}
		}
		recycleCopied(later, packEntries(later))
	}
	t.Logf("%d of 200 later encodings reused a recycled buffer", reused)
	for _, e := range []entry{aloneEntries[0], multiEntries[0]} {
		v := value(t, e.data)
		if want := bytes.Repeat(v[:1], 1000); v[0] == 'z' || !bytes.Equal(v, want) {
			t.Fatalf("an entry's data changed after its encodings were recycled: value starts %q", v[:8])
		}
	}
}

// BenchmarkEncodeBatch is the leader's encoding of a group commit of 64
// publishes of 1 KiB with a key (ApplyBatched's encode, packEntries, and
// with pooled=true the recycling): ns, B and allocs per message.
//
//	go test -run '^$' -bench EncodeBatch -benchmem ./raftfsm/
func BenchmarkEncodeBatch(b *testing.B) {
	const n = 64
	cmds := make([]*command.Command, n)
	for i := range cmds {
		cmds[i] = &command.Command{Op: command.OpPublish, Now: 1, Topic: "orders", Msgs: []mlog.Placed{{Partition: uint32(i % 4),
			Msg: &mlog.Message{Value: bytes.Repeat([]byte("v"), 1024), IdempotencyKey: fmt.Sprintf("%032x", i),
				MaxRetry: -1, BackoffBaseMs: -1, BackoffJitterMs: -1}}}}
	}
	for _, pooled := range []bool{false, true} {
		b.Run(fmt.Sprintf("pooled=%v", pooled), func(b *testing.B) {
			b.ReportAllocs()
			batch := make([]*pending, n)
			for i := range batch {
				batch[i] = &pending{}
			}
			for i := 0; i < b.N; i += n {
				for j, c := range cmds {
					if pooled {
						batch[j].enc, batch[j].buf = c.EncodePooled()
					} else {
						batch[j].enc = c.Encode()
					}
				}
				entries := packEntries(batch)
				if pooled {
					recycleCopied(batch, entries)
				}
			}
		})
	}
}

// fakeFuture is a proposal's future that answers once release is closed,
// with a result per command of its entry.
type fakeFuture struct {
	release chan struct{}
	n       int
}

func (f *fakeFuture) Error() error  { <-f.release; return nil }
func (f *fakeFuture) Index() uint64 { return 0 }
func (f *fakeFuture) Response() any {
	r := &fsm.Result{}
	if f.n > 1 {
		for range f.n {
			r.Multi = append(r.Multi, &fsm.Result{})
		}
	}
	return r
}

// A group handed in by SubmitAll goes into one batch whole, even when the
// batch would otherwise be cut in the middle of it (maxBatchCmds), so its
// commands commit together; every command is answered.
func TestSubmitAllStaysInOneBatch(t *testing.T) {
	var mu sync.Mutex
	var entries []*command.Command // decoded, in the order proposed
	release := make(chan struct{})
	b := NewBatcher(func(_ context.Context, data []byte) (raft.ApplyFuture, error) {
		c, err := command.Decode(data)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		entries = append(entries, c)
		first := len(entries) == 1
		mu.Unlock()
		n := 1
		if c.Op == command.OpMulti {
			n = len(c.Batch)
		}
		if first { // the first entry holds the pipeline until released
			return &fakeFuture{release: release, n: n}, nil
		}
		done := make(chan struct{})
		close(done)
		return &fakeFuture{release: done, n: n}, nil
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go b.Run(ctx)
	enc := func(topic string) []byte {
		return (&command.Command{Op: command.OpPublish, Topic: topic, Msgs: []mlog.Placed{{Msg: &mlog.Message{Value: []byte("x")}}}}).Encode()
	}
	var wg sync.WaitGroup
	submit := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Submit(ctx, enc("single"), nil); err != nil {
				t.Error(err)
			}
		}()
	}
	submit()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(entries) == 1 })
	const singles, group = maxBatchCmds - 12, 100
	for range singles {
		submit()
	}
	waitFor(t, func() bool { return len(b.in) == singles })
	encs, bufs := make([][]byte, group), make([]*[]byte, group)
	for i := range encs {
		encs[i] = enc("group")
	}
	qs, err := b.SubmitAll(ctx, encs, bufs)
	if err != nil {
		t.Fatal(err)
	}
	close(release)
	for i, q := range qs {
		if _, err := q.Wait(ctx); err != nil {
			t.Fatalf("group command %d: %v", i, err)
		}
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	holding := 0
	for _, e := range entries {
		n := 0
		for _, c := range append(e.Batch, e) {
			if c.Topic == "group" {
				n++
			}
		}
		if n > 0 {
			holding++
			if n != group {
				t.Errorf("an entry holds %d of the group's %d commands", n, group)
			}
		}
	}
	if holding != 1 {
		t.Errorf("the group's commands are in %d entries, want 1", holding)
	}
}

// waitFor polls cond for up to 5 s and fails the test when it never holds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
	}
}
