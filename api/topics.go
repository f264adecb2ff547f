package api

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	"github.com/mqd/mqd/command"
	"github.com/mqd/mqd/fsm"
	"github.com/mqd/mqd/group"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
)

// topicBody is the JSON of PUT /v1/topics/{topic}: every field optional.
type topicBody struct {
	Partitions      *int64  `json:"partitions"`
	MaxRetry        *int64  `json:"max_retry"`
	BackoffBaseMs   *int64  `json:"backoff_base_ms"`
	BackoffMaxMs    *int64  `json:"backoff_max_ms"`
	BackoffJitterMs *int64  `json:"backoff_jitter_ms"`
	AckTimeoutMs    *int64  `json:"ack_timeout_ms"`
	DedupWindowMs   *int64  `json:"dedup_window_ms"`
	RetentionMs     *int64  `json:"retention_ms"`
	MaxMessages     *int64  `json:"max_messages"`
	MaxBytes        *int64  `json:"max_bytes"`
	Overflow        *string `json:"overflow"`
	MaxMessageBytes *int64  `json:"max_message_bytes"`
	// Replicas: how many nodes hold the topic, with data groups (1, 3 or
	// 5; fixed at creation: a topic never moves between groups).
	Replicas *int64 `json:"replicas"`
}

// checkReplicas refuses a replicas field other than 1, 3 or 5.
func (b *topicBody) checkReplicas() error {
	if b.Replicas == nil {
		return nil
	}
	switch *b.Replicas {
	case 1, 3, 5:
		return nil
	}
	return fmt.Errorf("%w: replicas must be 1, 3 or 5, got %d", mlog.ErrInvalidConfig, *b.Replicas)
}

func (b *topicBody) patch() (mlog.Patch, error) {
	p := mlog.Patch{
		MaxRetry: b.MaxRetry, BackoffBaseMs: b.BackoffBaseMs, BackoffMaxMs: b.BackoffMaxMs,
		BackoffJitterMs: b.BackoffJitterMs, AckTimeoutMs: b.AckTimeoutMs, DedupWindowMs: b.DedupWindowMs,
		RetentionMs: b.RetentionMs, MaxMessages: b.MaxMessages, MaxBytes: b.MaxBytes,
		Overflow: b.Overflow, MaxMessageBytes: b.MaxMessageBytes,
	}
	if b.Partitions != nil {
		if v := *b.Partitions; v < 1 || v > mlog.MaxPartitions {
			// Checked here, before it is narrowed to uint32 (4294967297
			// would wrap to 1); the same code as the other fields.
			return p, fmt.Errorf("%w: partitions must be 1..%d, got %d", mlog.ErrInvalidConfig, mlog.MaxPartitions, v)
		}
		n := uint32(*b.Partitions)
		p.Partitions = &n
	}
	// Validate against the defaults here for a clear 400 before proposing;
	// the FSM validates the merged config again.
	// Every field is validated on its own, so merging onto the defaults
	// checks exactly the fields present.
	return p, p.Apply(mlog.DefaultConfig()).Validate()
}

func (s *Server) putTopic(ctx *fasthttp.RequestCtx, r *route) error {
	var b topicBody
	if err := optBody(ctx.PostBody(), &b); err != nil {
		return err
	}
	p, err := b.patch()
	if err == nil {
		err = b.checkReplicas()
	}
	if err != nil {
		return err
	}
	if _, err := s.topicConfig(r.topic); errors.Is(err, mlog.ErrTopicNotFound) {
		if handled, err := s.placeNewTopic(ctx, r, b.Replicas); handled {
			return err
		}
		// Creating adds data; changing a topic (retention, limits) may be
		// how an operator frees space, so it stays allowed.
		if err := s.node.CheckDisk(0); err != nil {
			return err
		}
	}
	res, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpPutTopic, Now: nowMs(), Topic: r.topic, Patch: p})
	if err != nil {
		return err
	}
	status := 200
	if res.Created {
		status = 201
	}
	return s.writeTopic(ctx, status, r.topic)
}

func (s *Server) deleteTopic(ctx *fasthttp.RequestCtx, r *route) error {
	if _, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpDeleteTopic, Now: nowMs(), Topic: r.topic}); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"deleted": r.topic})
	return nil
}

func (s *Server) getTopic(ctx *fasthttp.RequestCtx, r *route) error {
	return s.writeTopic(ctx, 200, r.topic)
}

func (s *Server) writeTopic(ctx *fasthttp.RequestCtx, status int, topic string) error {
	var st *fsm.TopicStats
	err := s.state.Read(func(r *fsm.Reader) error {
		var err error
		st, err = r.TopicStats(topic, nowMs())
		return err
	})
	if err != nil {
		return err
	}
	out := topicJSON(st)
	out.Placement = s.placement()
	writeJSON(ctx, status, out)
	return nil
}

// placement is where a topic's replicas are (SPEC section 12). Every topic
// lives in the cluster's one raft group today: its replicas are the
// group's voters, its leader the group's leader (omitted while none is
// known).
type placement struct {
	Group    string   `json:"group,omitempty"` // the data group; omitted for the default group
	Replicas []string `json:"replicas"`
	Leader   string   `json:"leader,omitempty"`
}

func (s *Server) placement() *placement {
	p := &placement{Group: s.group, Replicas: []string{}}
	if servers, err := s.node.Servers(); err == nil {
		for _, sv := range servers {
			if sv.Suffrage == raft.Voter {
				p.Replicas = append(p.Replicas, string(sv.ID))
			}
		}
	}
	if id, _, ok := s.node.Leader(); ok {
		p.Leader = id
	}
	return p
}

type partStats struct {
	Partition   uint32 `json:"partition"`
	FirstOffset uint64 `json:"first_offset"`
	NextOffset  uint64 `json:"next_offset"`
	Messages    uint64 `json:"messages"`
}

type topicStats struct {
	Name       string                 `json:"name"`
	Config     mlog.Config            `json:"config"`
	Messages   uint64                 `json:"messages"`
	Bytes      uint64                 `json:"bytes"`
	Partitions []partStats            `json:"partitions"`
	Groups     map[string]group.Stats `json:"groups"`
	Placement  *placement             `json:"placement,omitempty"`
}

func topicJSON(st *fsm.TopicStats) *topicStats {
	out := &topicStats{Name: st.Name, Config: st.Config, Messages: st.Messages, Bytes: st.Bytes, Groups: st.Groups}
	for _, p := range st.Partitions {
		out.Partitions = append(out.Partitions, partStats{p.Partition, p.FirstOffset, p.NextOffset, p.Messages})
	}
	return out
}

// maxTopicPage is the most topics GET /v1/topics answers at once.
const maxTopicPage = 1000

// listTopics answers a page of topics in name order: ?limit= (1..1000,
// default 1000) after ?after= (a name; default the start). "next", present
// when more topics follow, is the after of the next page.
func (s *Server) listTopics(ctx *fasthttp.RequestCtx, r *route) error {
	limit, err := queryUint(ctx, "limit", maxTopicPage, 1, maxTopicPage)
	if err != nil {
		return err
	}
	after := string(ctx.QueryArgs().Peek("after"))
	if id := ctx.Request.Header.Peek(listGroupHeader); len(id) > 0 && s.group == "" {
		// Another node's list of a data group it holds no replica of
		// (listAway): this node's replica answers for the group.
		v, held := s.view(string(id))
		if !held {
			return errorf(ErrUnavailable, "this node holds no replica of data group %q", id)
		}
		return v.listTopics(ctx, r)
	}
	if gn, ok := s.grouped(); ok {
		if dir := gn.Directory(); len(dir.Topics) > 0 {
			return s.listTopicsGrouped(ctx, r, gn, dir, after, limit)
		}
	}
	out := []*topicStats{}
	next := ""
	now := nowMs()
	err = s.state.Read(func(rd *fsm.Reader) error {
		var err error
		rd.EachTopicAfter(after, func(t string) bool {
			if !r.sees(t) {
				return true
			}
			if uint64(len(out)) == limit {
				next = out[len(out)-1].Name
				return false
			}
			var st *fsm.TopicStats
			if st, err = rd.TopicStats(t, now); err != nil {
				return false
			}
			out = append(out, topicJSON(st))
			return true
		})
		return err
	})
	if err != nil {
		return err
	}
	if len(out) > 0 {
		pl := s.placement() // every topic here lives in this one group
		for _, t := range out {
			t.Placement = pl
		}
	}
	body := map[string]any{"topics": out}
	if next != "" {
		body["next"] = next
	}
	writeJSON(ctx, 200, body)
	return nil
}

func (s *Server) putGroup(ctx *fasthttp.RequestCtx, r *route) error {
	if err := optBody(ctx.PostBody(), &struct{}{}); err != nil {
		return err
	}
	res, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpPutGroup, Now: nowMs(), Topic: r.topic, Group: r.group})
	if err != nil {
		return err
	}
	status := 200
	if res.Created {
		status = 201
	}
	writeJSON(ctx, status, map[string]any{"topic": r.topic, "group": r.group, "created": res.Created})
	return nil
}

func (s *Server) deleteGroup(ctx *fasthttp.RequestCtx, r *route) error {
	if _, err := s.node.Apply(r.ctx, &command.Command{Op: command.OpDeleteGroup, Now: nowMs(), Topic: r.topic, Group: r.group}); err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"deleted": r.group})
	return nil
}

func nowMs() int64 { return raftfsm.Now().UnixMilli() }
