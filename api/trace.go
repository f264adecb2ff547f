package api

import (
	"fmt"

	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
)

// MaxReconcileKeys bounds a reconcile request (SPEC §11).
const MaxReconcileKeys = 10000

type keyGroupJSON struct {
	State      string        `json:"state"`
	Deliveries uint64        `json:"deliveries"`
	History    []historyJSON `json:"history"`
}

type keyTraceJSON struct {
	Key         string                  `json:"key"`
	Partition   uint32                  `json:"partition"`
	Offset      uint64                  `json:"offset"`
	PublishedAt string                  `json:"published_at,omitempty"`
	Duplicates  uint64                  `json:"duplicates"`
	Groups      map[string]keyGroupJSON `json:"groups"`
}

// traceKey answers GET /v1/topics/{topic}/keys/{key} from the leader's
// state (as the other reads are: what it answers is committed).
func (s *Server) traceKey(ctx *fasthttp.RequestCtx, r *route) error {
	if _, err := checkKey("key", r.key); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	var t *fsm.KeyTrace
	err := s.state.Read(func(rd *fsm.Reader) error {
		var err error
		t, err = rd.TraceKey(r.topic, r.key, nowMs())
		return err
	})
	if err != nil {
		return err
	}
	out := keyTraceJSON{Key: t.Key, Partition: t.Partition, Offset: t.Offset, Duplicates: t.Duplicates,
		Groups: make(map[string]keyGroupJSON, len(t.Groups))}
	if t.PublishedAt > 0 {
		out.PublishedAt = rfc3339ms(t.PublishedAt)
	}
	for name, ks := range t.Groups {
		g := keyGroupJSON{State: ks.State, Deliveries: ks.Deliveries, History: make([]historyJSON, len(ks.History))}
		for i, h := range ks.History {
			g.History[i] = historyJSON{At: rfc3339ms(h.At), Kind: h.Kind, Reason: h.Reason, Node: h.Node}
		}
		out.Groups[name] = g
	}
	writeJSON(ctx, 200, out)
	return nil
}

type reconcileBody struct {
	Keys  []string `json:"keys"`
	Group *string  `json:"group"`
}

type groupKeysJSON struct {
	Acked    []string `json:"acked"`
	Pending  []string `json:"pending"`
	InFlight []string `json:"in_flight"`
	Dead     []string `json:"dead"`
}

// reconcile answers POST /v1/topics/{topic}/reconcile: one read
// transaction, a lookup per key and group.
func (s *Server) reconcile(ctx *fasthttp.RequestCtx, r *route) error {
	var b reconcileBody
	if err := decodeStrict(ctx.PostBody(), &b); err != nil {
		return err
	}
	if len(b.Keys) > MaxReconcileKeys {
		return fmt.Errorf("%w: %d keys > %d", ErrBodyTooLarge, len(b.Keys), MaxReconcileKeys)
	}
	for i, k := range b.Keys {
		if _, err := checkKey(fmt.Sprintf("keys.%d", i), k); err != nil {
			return fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
	}
	name := ""
	if b.Group != nil {
		name = *b.Group
		if !mlog.ValidName(name) {
			return fmt.Errorf("%w: group %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, name)
		}
	}
	var rec *fsm.Reconciliation
	err := s.state.Read(func(rd *fsm.Reader) error {
		var err error
		rec, err = rd.Reconcile(r.topic, b.Keys, name, nowMs())
		return err
	})
	if err != nil {
		return err
	}
	groups := make(map[string]groupKeysJSON, len(rec.Groups))
	for n, g := range rec.Groups {
		groups[n] = groupKeysJSON{Acked: g.Acked, Pending: g.Pending, InFlight: g.InFlight, Dead: g.Dead}
	}
	writeJSON(ctx, 200, map[string]any{"missing": rec.Missing, "stored": rec.Stored, "groups": groups})
	return nil
}
