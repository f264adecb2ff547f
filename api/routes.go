package api

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/mqd/mqd/auth"
	mlog "github.com/mqd/mqd/log"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"
)

// Perm is what a route asks of the caller's token (SPEC §8). Several bits
// mean any one of them suffices. The topic permissions (publish, consume,
// admin) apply to the topic named by the path's {topic}; on a route without
// {topic} they apply to every topic and the handler shows only what the
// token may see. The zero value is reserved: every route states its Perm.
type Perm uint8

// Permissions a route may require.
const (
	PermOpen    Perm = 1 << iota // no token needed
	PermPublish                  // publish:<glob> matching {topic}
	PermConsume                  // consume:<glob> matching {topic}
	PermAdmin                    // admin:<glob> matching {topic}
	PermCluster                  // cluster: joining and node-to-node routes
	PermMonitor                  // monitor: metrics and cluster state

	// PermAnyTopic is any permission on {topic} (GET of a topic), or on
	// any topic for a route without {topic} (GET /v1/topics, filtered).
	PermAnyTopic = PermPublish | PermConsume | PermAdmin
)

// Has reports whether p accepts the permission q.
func (p Perm) Has(q Perm) bool { return p&q != 0 }

// String lists p's bits as in SPEC §8, "|"-separated.
func (p Perm) String() string {
	var out []string
	for _, b := range []struct {
		bit  Perm
		name string
	}{{PermOpen, "open"}, {PermPublish, "publish"}, {PermConsume, "consume"}, {PermAdmin, "admin"},
		{PermCluster, "cluster"}, {PermMonitor, "monitor"}} {
		if p&b.bit != 0 {
			out = append(out, b.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "|")
}

// Route is one entry of the HTTP route table.
type Route struct {
	Method string
	// Pattern is the path: literal segments, {topic}, {group} and {id}
	// parameters (a literal wins over a parameter at the same place), and
	// last perhaps a {name...} that takes the rest of the path, possibly
	// empty or with slashes.
	Pattern string
	Leader  bool // runs on the leader: forwarded there by a follower
	Perm    Perm
	// Query names the query parameters the route takes. On a /v1/ route
	// any other parameter, a repeated one, or a name or value that is not
	// valid UTF-8 is refused (checkQuery); other routes (the console,
	// profiles, probes) are not checked.
	Query []string
	// Stale marks a read that ?stale=ok serves from the answering node's
	// applied state, without the leader (api/stale.go); without it, the
	// read waits at most readLeaderWait for a leader.
	Stale bool
	// Coalesce marks a leader route whose command a follower sends in a
	// coalesced forward instead of forwarding the request (coalesce.go).
	Coalesce bool
	handler  func(*fasthttp.RequestCtx, *route) error

	hasTopic, hasGroup bool // the pattern names them
	idx                int  // the route's place in the table (a data group's view has its own table, views.go)
}

// route is one request's matched Route and its path parameters.
type route struct {
	def          *Route
	topic, group string
	dlqID        string          // the path's {id}: a dead letter's, a node's, or a data group's
	key          string          // the path's {key}: an idempotency key
	id           *auth.Identity  // the caller's token; nil when auth is off
	rest         string          // {name...}: the rest of the path
	allow        string          // on ErrMethod: the path's methods
	ctx          context.Context // the request's deadline, for leader routes
	remote       bool            // a follower runs the handler: its command goes to the leader coalesced
}

// routes is the whole HTTP API: openapi.yaml describes the same list
// (TestOpenAPI compares them) and docs/API.md explains it.
func (s *Server) routes() []Route {
	const (
		topic = "/v1/topics/{topic}"
		grp   = topic + "/groups/{group}"
	)
	rt := func(method, pattern string, leader bool, p Perm, h func(*fasthttp.RequestCtx, *route) error) Route {
		return Route{Method: method, Pattern: pattern, Leader: leader, Perm: p, handler: h}
	}
	pprof := func(ctx *fasthttp.RequestCtx, _ *route) error {
		if !s.opts.Pprof {
			return fmt.Errorf("%w: profiles are off (start mqd with --pprof)", ErrNotFound)
		}
		pprofhandler.PprofHandler(ctx)
		return nil
	}
	// read: a read that may be served stale, taking ?stale= after names.
	coalesce := func(r Route) Route { r.Coalesce = true; return r }
	read := func(r Route, names ...string) Route { r.Query, r.Stale = append(names, "stale"), true; return r }
	return []Route{
		rt("GET", "/healthz", false, PermOpen, s.healthz),
		rt("GET", "/readyz", false, PermOpen, s.readyz),
		rt("GET", "/metrics", false, PermMonitor, s.metricsHandler),
		rt("GET", "/v1/cluster", false, PermMonitor, s.cluster),
		rt("GET", "/v1/internal/status", false, PermCluster, s.status),
		rt("POST", "/v1/internal/join", true, PermCluster, s.join),
		rt("POST", forwardPattern, false, PermCluster, s.forwarded),
		rt("DELETE", "/v1/cluster/nodes/{id}", true, PermCluster, s.removeNode),
		rt("POST", "/v1/cluster/nodes/{id}/drain", true, PermCluster, s.drainNode),
		rt("POST", "/v1/cluster/rebalance", true, PermCluster, s.rebalance),
		rt("GET", "/v1/cluster/backup", false, PermCluster, s.backup),
		rt("GET", "/v1/internal/groups/{id}/backup", false, PermCluster, s.groupBackup),
		rt("POST", "/v1/cluster/clock/accept", false, PermCluster, s.acceptClock),
		rt("GET", "/v1/openapi.yaml", false, PermOpen, s.openapi),
		rt("GET", "/ui", false, PermOpen, s.console),
		rt("GET", "/ui/{file...}", false, PermOpen, s.console),
		rt("GET", "/debug/pprof/{profile...}", false, PermMonitor, pprof),
		rt("POST", "/debug/pprof/{profile...}", false, PermMonitor, pprof),

		read(rt("GET", "/v1/topics", true, PermAnyTopic, s.listTopics), "limit", "after"),
		rt("PUT", topic, true, PermAdmin, s.putTopic),
		read(rt("GET", topic, true, PermAnyTopic, s.getTopic)),
		rt("DELETE", topic, true, PermAdmin, s.deleteTopic),
		coalesce(rt("POST", topic+"/messages", true, PermPublish, s.publish)),
		coalesce(rt("POST", topic+"/messages:batch", true, PermPublish, s.publishBatch)),
		read(rt("GET", topic+"/keys/{key}", true, PermConsume, s.traceKey)),
		rt("POST", topic+"/reconcile", true, PermConsume, s.reconcile),
		read(rt("GET", topic+"/messages", true, PermConsume, s.browse), "partition", "offset", "limit"),

		rt("PUT", grp, true, PermConsume|PermAdmin, s.putGroup),
		rt("DELETE", grp, true, PermAdmin, s.deleteGroup),
		rt("POST", grp+"/fetch", true, PermConsume, s.fetch),
		rt("POST", grp+"/ack", true, PermConsume, s.ack),
		rt("POST", grp+"/nack", true, PermConsume, s.nack),
		rt("POST", grp+"/extend", true, PermConsume, s.extend),
		rt("POST", grp+"/process", true, PermConsume, s.process),
		read(rt("GET", grp+"/dlq", true, PermConsume, s.listDeadLetters), "limit", "after", "idempotency_key"),
		rt("POST", grp+"/dlq/replay", true, PermAdmin, s.replayDeadLetters),
		rt("DELETE", grp+"/dlq/{id}", true, PermAdmin, s.deleteDeadLetter),
	}
}

// node is one path segment of the route tree.
type node struct {
	lits   []litChild // literal segments, tried before param
	param  *node      // a {name} segment
	pname  string
	star   *node    // {name...}: the rest of the path
	routes []*Route // by method
	allow  string   // the routes' methods, for a 405's Allow header
}

type litChild struct {
	seg  string
	next *node
}

// router matches paths segment by segment: no regular expressions, no
// allocation but the request's route.
type router struct{ root node }

func newRouter(table []Route) (*router, error) {
	rt := &router{}
	for i := range table {
		r := &table[i]
		r.idx = i
		if r.Perm == 0 || r.handler == nil {
			return nil, fmt.Errorf("route %s %s: no permission or handler", r.Method, r.Pattern)
		}
		n := &rt.root
		for seg := range strings.SplitSeq(strings.TrimPrefix(r.Pattern, "/"), "/") {
			n = n.child(seg)
		}
		for _, o := range n.routes {
			if o.Method == r.Method {
				return nil, fmt.Errorf("route %s %s: registered twice", r.Method, r.Pattern)
			}
		}
		n.routes = append(n.routes, r)
		if n.allow != "" {
			n.allow += ", "
		}
		n.allow += r.Method
		r.hasTopic = strings.Contains(r.Pattern, "/{topic}")
		r.hasGroup = strings.Contains(r.Pattern, "/{group}")
	}
	return rt, nil
}

func (n *node) child(seg string) *node {
	switch {
	case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "...}"):
		if n.star == nil {
			n.star = &node{}
		}
		return n.star
	case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}"):
		if n.param == nil {
			n.param = &node{pname: seg[1 : len(seg)-1]}
		}
		return n.param
	}
	for _, l := range n.lits {
		if l.seg == seg {
			return l.next
		}
	}
	c := &node{}
	n.lits = append(n.lits, litChild{seg, c})
	return c
}

// match finds the route for method and path, and fills the path's
// parameters into r. path is the request's path as sent, neither decoded
// nor normalized: it is split at its slashes first and each segment is
// percent-decoded after, so a name never spans segments and "." or ".."
// is a name (refused by validate), not a step up the path: resolving
// "a/../b" first would make "DELETE /v1/topics/x%2F..%2Forders" delete
// topic orders. A path no route has answers ErrNotFound; a path with
// routes but not for this method, ErrMethod.
func (rt *router) match(method []byte, path string, r *route) error {
	if path == "/v1/topics/" {
		path = "/v1/topics"
	}
	n := &rt.root
	rest, ok := strings.CutPrefix(path, "/")
	for ok {
		if n.star != nil {
			rest, err := url.PathUnescape(rest)
			if err != nil {
				return fmt.Errorf("%w: malformed percent-encoding in the path", ErrBadRequest)
			}
			n, r.rest = n.star, rest
			break
		}
		var seg string
		seg, rest, ok = strings.Cut(rest, "/")
		seg, err := url.PathUnescape(seg)
		if err != nil {
			return fmt.Errorf("%w: malformed percent-encoding in the path", ErrBadRequest)
		}
		next := n.lit(seg)
		if next == nil && n.param != nil {
			next = n.param
			r.set(next.pname, seg)
		}
		if next == nil {
			return fmt.Errorf("%w: no route %s %s", ErrNotFound, method, path)
		}
		n = next
	}
	for _, d := range n.routes {
		if d.Method == string(method) {
			r.def = d
			return nil
		}
	}
	if len(n.routes) == 0 {
		return fmt.Errorf("%w: no route %s %s", ErrNotFound, method, path)
	}
	r.allow = n.allow
	return fmt.Errorf("%w: %s %s (allowed: %s)", ErrMethod, method, path, n.allow)
}

func (n *node) lit(seg string) *node {
	for _, l := range n.lits {
		if l.seg == seg {
			return l.next
		}
	}
	return nil
}

func (r *route) set(name, v string) {
	switch name {
	case "topic":
		r.topic = v
	case "group":
		r.group = v
	case "id":
		r.dlqID = v
	case "key":
		r.key = v
	}
}

// validate checks the path's names: a bad one is a 400 before anything
// else reads it.
func (r *route) validate() error {
	if r.def.hasTopic && !mlog.ValidName(r.topic) {
		return fmt.Errorf("%w: topic %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, r.topic)
	}
	if r.def.hasGroup && !mlog.ValidName(r.group) {
		return fmt.Errorf("%w: group %q must match [A-Za-z0-9._-]{1,200} and not be . or ..", mlog.ErrInvalidName, r.group)
	}
	return nil
}

// checkQuery refuses, on a /v1/ route, a query parameter the route does
// not take, one given more than once (which value counts would be a
// guess), and a name or value that is not valid UTF-8 once
// percent-decoded (after=%ff). It runs before the request is forwarded to
// the leader or anything is looked up.
func (r *route) checkQuery(args *fasthttp.Args) error {
	if !strings.HasPrefix(r.def.Pattern, "/v1/") || args.Len() == 0 {
		return nil
	}
	seen := make(map[string]bool, args.Len())
	for k, v := range args.All() {
		name := string(k)
		switch {
		case !utf8.ValidString(name):
			return fmt.Errorf("%w: a query parameter's name is not valid UTF-8", ErrBadRequest)
		case !slices.Contains(r.def.Query, name):
			return fmt.Errorf("%w: unknown query parameter %q; %s", ErrBadRequest, name, r.takes())
		case seen[name]:
			return fmt.Errorf("%w: query parameter %s given more than once, give it once", ErrBadRequest, name)
		case !utf8.Valid(v):
			return fmt.Errorf("%w: query parameter %s is not valid UTF-8", ErrBadRequest, name)
		}
		seen[name] = true
	}
	return nil
}

// takes says which query parameters the route takes.
func (r *route) takes() string {
	if len(r.def.Query) == 0 {
		return r.def.Method + " " + r.def.Pattern + " takes none"
	}
	return r.def.Method + " " + r.def.Pattern + " takes " + strings.Join(r.def.Query, ", ")
}
