package housekeep

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	bolt "go.etcd.io/bbolt"
)

// localGroup is a Group of one replica without raft: a proposal is applied
// to a real fsm.FSM at the next index, and recorded.
type localGroup struct {
	*fsm.FSM
	idx      uint64
	proposed []*command.Command
}

func (g *localGroup) Propose(_ context.Context, c *command.Command) (*fsm.Result, error) {
	g.idx++
	g.proposed = append(g.proposed, c)
	r, _ := g.Apply(&raft.Log{Index: g.idx, Term: 1, Type: raft.LogCommand, Data: c.Encode()}).(*fsm.Result)
	if r == nil {
		return nil, fmt.Errorf("no result at index %d", g.idx)
	}
	return r, r.Err
}

func (g *localGroup) must(t *testing.T, c *command.Command) *fsm.Result {
	t.Helper()
	r, err := g.Propose(context.Background(), c)
	if err != nil {
		t.Fatalf("%s: %v", c.Op, err)
	}
	return r
}

// The keeper sweeps through the Group interface alone: a lease past its
// deadline is proposed for expiry (once, as this node), one that is not
// due is left alone, and nothing is proposed when nothing is due.
func TestSweepLeasesProposesDueExpiries(t *testing.T) {
	f, err := fsm.OpenFSM(filepath.Join(t.TempDir(), "fsm.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := &localGroup{FSM: f}
	g.must(t, &command.Command{Op: command.OpPutTopic, Now: 1, Topic: "t"})
	g.must(t, &command.Command{Op: command.OpPublish, Now: 2, Topic: "t", Msgs: []mlog.Placed{
		{Msg: &mlog.Message{Value: []byte("a")}}, {Msg: &mlog.Message{Value: []byte("b")}}}})
	g.must(t, &command.Command{Op: command.OpLease, Now: 5000, Topic: "t", Group: "g", Max: 1, LeaseMs: 1000})
	g.must(t, &command.Command{Op: command.OpLease, Now: 5000, Topic: "t", Group: "g", Max: 1, LeaseMs: 9000})
	before := len(g.proposed)
	now := time.UnixMilli(6500)
	k := New(g, "n1", func() time.Time { return now }, slog.New(slog.DiscardHandler))
	k.Start()
	defer k.Stop()
	k.SweepLeases(context.Background())
	got := g.proposed[before:]
	if len(got) != 1 || got[0].Op != command.OpExpire || len(got[0].Expired) != 1 ||
		got[0].NodeID != "n1" || got[0].Now != 6500 || len(got[0].Rands) != 1 {
		t.Fatalf("proposed %d commands (%+v); want one OpExpire of the one due lease by n1 at 6500", len(got), got)
	}
	var due []group.Expired
	_ = f.View(func(tx *bolt.Tx) error {
		due, err = group.DueLeases(tx, now.UnixMilli(), 10)
		return err
	})
	if len(due) != 0 || err != nil {
		t.Fatalf("still due after the sweep: %+v, %v", due, err)
	}
	k.SweepLeases(context.Background())
	if n := len(g.proposed) - before; n != 1 {
		t.Fatalf("a sweep with nothing due proposed %d more commands", n-1)
	}
}
