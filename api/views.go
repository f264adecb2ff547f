package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mqd/mqd/fsm"
	mlog "github.com/mqd/mqd/log"
	"github.com/mqd/mqd/raftfsm"
	"github.com/mqd/mqd/replica"
	"github.com/valyala/fasthttp"
)

// Data groups (SPEC section 12). The metadata group's directory places a
// topic in a data group (raftfsm/placement.go); a topic it does not name
// lives in the default group, as every topic did before. A request about
// a placed topic is served by the view of its group: a Server sharing the
// node's core whose node (proposals, leadership) and state are the data
// group's, with the route table bound to it, so that every handler keeps
// its meaning for the one group that holds the whole topic. A node that
// holds no replica of the group forwards the request to the group's
// leader, which every node learns from the probes (raftfsm/leaders.go), or
// to a member when it knows none.

// groupedNode is what a node with data groups answers (*raftfsm.Node).
type groupedNode interface {
	TopicGroup(topic string) string
	HeldGroup(id string) (*raftfsm.GroupView, bool)
	GroupMembers(id string) []string
	GroupLeader(id string) (leader, httpAddr string, ok bool)
	PlaceTopic(ctx context.Context, topic string, replicas int) (string, error)
	Directory() *fsm.Directory
	Drain(ctx context.Context, id string) ([]raftfsm.Move, error)
	Rebalance(ctx context.Context) ([]raftfsm.Move, error)
	GroupBackup(id string) (*fsm.Backup, bool, error)
	SpoolBackup(r io.Reader, size int64) (*os.File, error)
}

// views are the node's data groups' views, made on a group's first
// request.
type views struct {
	mu sync.Mutex
	m  map[string]*Server
}

// grouped is the node's data groups, if it has any.
func (s *Server) grouped() (groupedNode, bool) {
	if s.group != "" {
		return nil, false
	}
	gn, ok := s.node.(groupedNode)
	return gn, ok
}

// view is the server of data group id's requests, if this node holds a
// replica of the group.
func (s *Server) view(id string) (*Server, bool) {
	gn, ok := s.grouped()
	if !ok {
		return nil, false
	}
	gv, held := gn.HeldGroup(id)
	if !held {
		return nil, false
	}
	s.views.mu.Lock()
	defer s.views.mu.Unlock()
	if v := s.views.m[id]; v != nil && v.node.(*raftfsm.GroupView).Replica() == gv.Replica() {
		return v, true
	}
	v := &Server{core: s.core, node: gv, state: gv.Replica().FSM(), group: id}
	v.table = v.routes()
	gv.Replica().FSM().OnNotify(s.waiters.wake)
	if s.views.m == nil {
		s.views.m = map[string]*Server{}
	}
	s.views.m[id] = v
	return v, true
}

// dispatch runs a matched, authorized request: on the view of its topic's
// data group when the topic is placed in one (or on a node that holds
// it), else here; stale reads from this node's state, leader routes on
// the leader.
func (s *Server) dispatch(ctx *fasthttp.RequestCtx, r *route, stale bool) error {
	sv := s
	if r.def.hasTopic {
		if gn, ok := s.grouped(); ok {
			if id := s.topicGroup(ctx, gn, r.topic); id != "" {
				v, held := s.waitView(ctx, gn, id)
				if !held {
					if fa, ok := longPoll(ctx, r); ok {
						return s.pollViaMember(ctx, gn, id, fa)
					}
					return s.toGroupMember(ctx, gn, id)
				}
				sv, r.def = v, &v.table[r.def.idx]
			}
		}
	}
	switch {
	case stale:
		return sv.serveStale(ctx, r)
	case r.def.Leader:
		return sv.onLeader(ctx, r)
	}
	return r.def.handler(ctx, r)
}

// placedHeader, on a request the metadata leader forwards to a member of
// the data group it just placed the topic in, names that group: the member
// waits (at most placeWait) until it has applied the placement and opened
// its replica, instead of serving the topic from the default group. A
// client that sends it only makes its request wait.
const placedHeader = "Mq-Placed-Group"

// placeWait bounds a member's wait for a placement it was told of, and for
// the opening of its replica of a group the directory names it in.
const placeWait = 3 * time.Second

// topicGroup is the data group of topic, "" for the default group; told
// of a new placement (placedHeader), it waits for the directory to show it.
func (s *Server) topicGroup(ctx *fasthttp.RequestCtx, gn groupedNode, topic string) string {
	id := gn.TopicGroup(topic)
	if id != "" || len(ctx.Request.Header.Peek(placedHeader)) == 0 {
		return id
	}
	until := time.Now().Add(placeWait)
	for id == "" && time.Now().Before(until) {
		time.Sleep(5 * time.Millisecond)
		id = gn.TopicGroup(topic)
	}
	return id
}

// waitView is the view of data group id; when the directory names this
// node a member but its replica is not open yet (the directory's change
// was just applied), it waits at most placeWait for it.
func (s *Server) waitView(ctx *fasthttp.RequestCtx, gn groupedNode, id string) (*Server, bool) {
	v, held := s.view(id)
	if held || !containsID(gn.GroupMembers(id), s.node.ID()) {
		return v, held
	}
	until := time.Now().Add(placeWait)
	for !held && time.Now().Before(until) {
		time.Sleep(5 * time.Millisecond)
		v, held = s.view(id)
	}
	return v, held
}

// toGroupMember forwards a request about a topic of data group id, which
// this node holds no replica of: to the group's leader when this node knows
// it (from the probes: raftfsm/leaders.go), so that it is served in one
// hop; else, or when the leader cannot be reached, to the members in the
// directory's order, the next one when one cannot be reached or, for a
// read, lost the connection (a member forwards on to the leader). When
// none answers, the client hears 503 and retries.
func (s *Server) toGroupMember(ctx *fasthttp.RequestCtx, gn groupedNode, id string) error {
	hops, _ := strconv.Atoi(string(ctx.Request.Header.Peek(forwardHeader)))
	if hops >= maxForwardHops {
		ctx.Response.Header.Set(forwardLoopHeader, "1")
		return fmt.Errorf("%w: data group %s is changing, retry", replica.ErrNotLeader, id)
	}
	rctx, cancel, err := deadline(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	ctx.Request.Header.Set(placedHeader, id)
	addrs, toLeader := s.groupTargets(gn, id)
	err = fmt.Errorf("%w: no member of data group %s has a known address", replica.ErrNotLeader, id)
	for i, addr := range addrs {
		if i == 0 && toLeader {
			s.metrics.countForward(forwardToLeader)
		} else {
			s.metrics.countForward(forwardToMember)
		}
		err = s.forwardTo(rctx, ctx, addr, hops, nil)
		if !errors.Is(err, errLeaderUnreachable) && !errors.Is(err, errLeaderLost) {
			return err
		}
		ctx.Response.Reset()
	}
	if errors.Is(err, errLeaderUnreachable) || errors.Is(err, errLeaderLost) {
		// Nothing was sent, or a read was cut: safe to retry.
		return errorf(ErrUnavailable, "no member of data group %s %v answered (%v); retry", id, gn.GroupMembers(id), err)
	}
	return err
}

// groupTargets are the HTTP addresses a request about data group id, which
// this node holds no replica of, goes to, in the order to try them: the
// group's leader when this node knows it (from the probes), then the other
// members the directory names, in its order, that have an address.
// toLeader: the first is the leader.
func (s *Server) groupTargets(gn groupedNode, id string) (addrs []string, toLeader bool) {
	leader, addr, known := gn.GroupLeader(id)
	if known && leader != s.node.ID() {
		addrs, toLeader = append(addrs, addr), true
	}
	nodes := s.state.Nodes()
	for _, m := range gn.GroupMembers(id) {
		if info, ok := nodes[m]; ok && info.HTTPAddr != "" && m != s.node.ID() && !(known && m == leader) {
			addrs = append(addrs, info.HTTPAddr)
		}
	}
	return addrs, toLeader
}

// placeNewTopic is the creation of a topic that does not exist, on the
// metadata leader, when new topics go to data groups (Options.DataGroups):
// the topic is placed (raftfsm.Node.PlaceTopic) and the request is then
// served by its group, once this node holds it, or by a member. handled
// false: the topic goes to the default group (data groups are off, this
// is a data group's view, or the state format is below 4: a member runs
// a binary without data groups).
func (s *Server) placeNewTopic(ctx *fasthttp.RequestCtx, r *route, replicas *int64) (handled bool, err error) {
	gn, ok := s.grouped()
	if !ok || !s.opts.DataGroups {
		return false, nil
	}
	want := raftfsm.DefaultReplicas
	if replicas != nil {
		want = int(*replicas)
	}
	id, err := gn.PlaceTopic(r.ctx, r.topic, want)
	if err != nil || id == "" {
		return err != nil, err
	}
	members := gn.GroupMembers(id)
	for {
		if v, held := s.view(id); held {
			r2 := *r
			r2.def = &v.table[r.def.idx]
			return true, v.onLeader(ctx, &r2)
		}
		if !containsID(members, s.node.ID()) {
			return true, s.toGroupMember(ctx, gn, id)
		}
		// This node is a member: its replica opens once the directory's
		// change is applied here (raftfsm/groups.go).
		if err := pause(r.ctx, 10*time.Millisecond); err != nil {
			return true, fmt.Errorf("%w: data group %s of topic %s did not open here in time", replica.ErrNotLeader, id, r.topic)
		}
	}
}

func containsID(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// topicServer is the server of topic's group: this one for the default
// group, or its data group's view when this node holds a replica of it
// (ok false: it holds none, and group names the one that does).
func (s *Server) topicServer(dir *fsm.Directory, topic string) (sv *Server, group string, ok bool) {
	id := dir.GroupOf(topic)
	if id == "" {
		return s, "", true
	}
	v, held := s.view(id)
	if !held {
		return nil, id, false
	}
	return v, id, true
}

// listTopicsGrouped is GET /v1/topics on a node whose directory places
// topics in data groups: the names of the default group's topics and of
// the placed ones in one order, each with its stats from the replica this
// node holds; a topic of a group this node holds no replica of is listed
// with its name and placement only (its leader as the probes tell it).
func (s *Server) listTopicsGrouped(ctx *fasthttp.RequestCtx, r *route, gn groupedNode, dir *fsm.Directory, after string, limit uint64) error {
	var names []string
	err := s.state.Read(func(rd *fsm.Reader) error {
		rd.EachTopicAfter(after, func(t string) bool {
			if r.sees(t) {
				names = append(names, t)
			}
			return true
		})
		return nil
	})
	if err != nil {
		return err
	}
	for t := range dir.Topics {
		if t > after && r.sees(t) {
			names = append(names, t)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	next := ""
	if uint64(len(names)) > limit {
		names = names[:limit]
		next = names[len(names)-1]
	}
	out := make([]any, 0, len(names))
	now := nowMs()
	places := map[*Server]*placement{} // one per group, not per topic
	away := map[string]*placement{}    // the same for the groups not held here
	// Per group not held here: its topics as a member of it lists them.
	listed := map[string]map[string]json.RawMessage{}
	for _, t := range names {
		sv, id, ok := s.topicServer(dir, t)
		if !ok {
			if away[id] == nil {
				away[id] = &placement{Group: id, Replicas: dir.Groups[id]}
				away[id].Leader, _, _ = gn.GroupLeader(id)
				listed[id] = s.listAway(ctx, r, gn, id, after, limit)
			}
			switch js, ok := listed[id][t]; {
			case ok:
				out = append(out, js)
			case listed[id] == nil:
				// No member of the group answered: the name and the
				// placement the directory holds.
				out = append(out, &topicStats{Name: t, Placement: away[id]})
			}
			continue
		}
		var ts *fsm.TopicStats
		err := sv.state.Read(func(rd *fsm.Reader) error {
			var err error
			ts, err = rd.TopicStats(t, now)
			return err
		})
		if errors.Is(err, mlog.ErrTopicNotFound) {
			continue // placed, and not created yet or deleted since
		}
		if err != nil {
			return err
		}
		if places[sv] == nil {
			places[sv] = sv.placement()
		}
		js := topicJSON(ts)
		js.Placement = places[sv]
		out = append(out, js)
	}
	body := map[string]any{"topics": out}
	if next != "" {
		body["next"] = next
	}
	writeJSON(ctx, 200, body)
	return nil
}

// listGroupHeader, on GET /v1/topics?stale=ok that one node sends another,
// asks for the topics of the one data group it names, from the receiving
// node's replica of it (listTopics).
const listGroupHeader = "Mq-List-Group"

// listAway is the page of data group id's topics (by name, as JSON) that a
// member of the group lists from its replica, for the page of GET
// /v1/topics this node answers while it holds no replica of the group: the
// group's leader first, then the other members, with the client's headers
// (its token sees the same topics there). nil: none answered.
func (s *Server) listAway(ctx *fasthttp.RequestCtx, r *route, gn groupedNode, id, after string, limit uint64) map[string]json.RawMessage {
	dl, _ := r.ctx.Deadline()
	addrs, _ := s.groupTargets(gn, id)
	hops, _ := strconv.Atoi(string(ctx.Request.Header.Peek(forwardHeader)))
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	q := url.Values{"stale": {"ok"}, "limit": {strconv.FormatUint(limit, 10)}}
	if after != "" {
		q.Set("after", after)
	}
	uri := "/v1/topics?" + q.Encode()
	for _, addr := range addrs {
		ctx.Request.Header.CopyTo(&req.Header)
		req.Header.SetMethod(fasthttp.MethodGet)
		req.Header.SetContentLength(0)
		req.Header.Del(fasthttp.HeaderAcceptEncoding) // the answer is read here, not relayed
		req.SetRequestURI(uri)
		req.SetHost(addr)
		req.URI().SetScheme("http")
		req.Header.Set(forwardHeader, strconv.Itoa(hops+1))
		req.Header.Set(listGroupHeader, id)
		resp.Reset()
		if err := s.fwd.DoDeadline(req, resp, dl); err != nil || resp.StatusCode() != fasthttp.StatusOK {
			continue
		}
		var page struct {
			Topics []json.RawMessage `json:"topics"`
		}
		if json.Unmarshal(resp.Body(), &page) != nil {
			continue
		}
		out := make(map[string]json.RawMessage, len(page.Topics))
		for _, js := range page.Topics {
			var t struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(js, &t) == nil {
				out[t.Name] = js
			}
		}
		return out
	}
	return nil
}

// errNoDataGroups: a move asked of a node that has no data groups (an
// in-process test's).
var errNoDataGroups = fmt.Errorf("%w: this node has no data groups", ErrNotFound)

// drainNode answers POST /v1/cluster/nodes/{id}/drain: every data group
// replica on the node goes to another node (raftfsm/moves.go). The answer
// lists the moves recorded; each group's leader then carries them out.
func (s *Server) drainNode(ctx *fasthttp.RequestCtx, r *route) error {
	if err := optBody(ctx.PostBody(), &struct{}{}); err != nil {
		return err
	}
	gn, ok := s.grouped()
	if !ok {
		return errNoDataGroups
	}
	moves, err := gn.Drain(r.ctx, r.dlqID) // the path's {id}
	if err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"node": r.dlqID, "moves": nonNilMoves(moves)})
	return nil
}

// rebalance answers POST /v1/cluster/rebalance: replicas and preferred
// leaders evened out over the current nodes (raftfsm/moves.go).
func (s *Server) rebalance(ctx *fasthttp.RequestCtx, r *route) error {
	if err := optBody(ctx.PostBody(), &struct{}{}); err != nil {
		return err
	}
	gn, ok := s.grouped()
	if !ok {
		return errNoDataGroups
	}
	moves, err := gn.Rebalance(r.ctx)
	if err != nil {
		return err
	}
	writeJSON(ctx, 200, map[string]any{"moves": nonNilMoves(moves)})
	return nil
}

func nonNilMoves(m []raftfsm.Move) []raftfsm.Move {
	if m == nil {
		return []raftfsm.Move{}
	}
	return m
}
