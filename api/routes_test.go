package api

import (
	"errors"
	"testing"

	mlog "github.com/mqd/mqd/log"
)

func mustRouter(t testing.TB) *router {
	t.Helper()
	rt, err := newRouter((&Server{core: &core{}}).routes())
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestRouterMatch(t *testing.T) {
	rt := mustRouter(t)
	cases := []struct {
		method, path string
		pattern      string // the route matched, or "" with err
		err          error
		topic, group string
		id           string
		allow        string // with ErrMethod
	}{
		{method: "GET", path: "/healthz", pattern: "/healthz"},
		{method: "GET", path: "/v1/topics", pattern: "/v1/topics"},
		{method: "GET", path: "/v1/topics/", pattern: "/v1/topics"},
		{method: "GET", path: "/v1/topics/t1", pattern: "/v1/topics/{topic}", topic: "t1"},
		{method: "PUT", path: "/v1/topics/t1", pattern: "/v1/topics/{topic}", topic: "t1"},
		{method: "POST", path: "/v1/topics/t1/messages", pattern: "/v1/topics/{topic}/messages", topic: "t1"},
		{method: "POST", path: "/v1/topics/t1/messages:batch", pattern: "/v1/topics/{topic}/messages:batch", topic: "t1"},
		{method: "POST", path: "/v1/topics/t/groups/g/fetch", pattern: "/v1/topics/{topic}/groups/{group}/fetch", topic: "t", group: "g"},
		{method: "PUT", path: "/v1/topics/t/groups/g", pattern: "/v1/topics/{topic}/groups/{group}", topic: "t", group: "g"},
		{method: "GET", path: "/v1/topics/t/groups/g/dlq", pattern: "/v1/topics/{topic}/groups/{group}/dlq", topic: "t", group: "g"},
		{method: "POST", path: "/v1/topics/t/groups/g/dlq/replay", pattern: "/v1/topics/{topic}/groups/{group}/dlq/replay", topic: "t", group: "g"},
		{method: "DELETE", path: "/v1/topics/t/groups/g/dlq/42", pattern: "/v1/topics/{topic}/groups/{group}/dlq/{id}", topic: "t", group: "g", id: "42"},
		// A topic may be named like a literal segment.
		{method: "GET", path: "/v1/topics/groups", pattern: "/v1/topics/{topic}", topic: "groups"},
		{method: "POST", path: "/v1/topics/messages/messages", pattern: "/v1/topics/{topic}/messages", topic: "messages"},
		{method: "GET", path: "/debug/pprof/", pattern: "/debug/pprof/{profile...}"},
		{method: "GET", path: "/debug/pprof/heap", pattern: "/debug/pprof/{profile...}"},
		// A literal wins over a parameter: replay is not a dead letter id.
		{method: "DELETE", path: "/v1/topics/t/groups/g/dlq/replay", err: ErrMethod, allow: "POST"},
		{method: "PATCH", path: "/v1/topics/t", err: ErrMethod, allow: "PUT, GET, DELETE"},
		{method: "GET", path: "/v1/topics/t/groups/g", err: ErrMethod, allow: "PUT, DELETE"},
		{method: "DELETE", path: "/v1/topics/t/messages", err: ErrMethod, allow: "POST, GET"},
		{method: "GET", path: "/v1/topics/t/messages", pattern: "/v1/topics/{topic}/messages", topic: "t"},
		{method: "POST", path: "/healthz", err: ErrMethod, allow: "GET"},
		{method: "GET", path: "/v1/nope", err: ErrNotFound},
		{method: "GET", path: "/", err: ErrNotFound},
		{method: "GET", path: "", err: ErrNotFound},
		{method: "GET", path: "//v1/topics", err: ErrNotFound},
		{method: "GET", path: "/v1/topics/t/", err: ErrNotFound},
		{method: "GET", path: "/v1/topics/t/zzz", err: ErrNotFound},
		{method: "POST", path: "/v1/topics/t/groups/g/fetch/more", err: ErrNotFound},
		{method: "POST", path: "/v1/topics/a/b", err: ErrNotFound},
		{method: "GET", path: "/debug/pprof", err: ErrNotFound},
		{method: "GET", path: "/healthz/", err: ErrNotFound},
		// The path as sent: split at its slashes, then each segment
		// decoded, so no name spans segments and dot segments are names
		// (validate refuses them) rather than steps up the path.
		{method: "DELETE", path: "/v1/topics/x%2F..%2Fvictim", pattern: "/v1/topics/{topic}", topic: "x/../victim"},
		{method: "DELETE", path: "/v1/topics/..", pattern: "/v1/topics/{topic}", topic: ".."},
		{method: "PUT", path: "/v1/topics/.", pattern: "/v1/topics/{topic}", topic: "."},
		{method: "DELETE", path: "/v1/topics/x/../victim", err: ErrNotFound},
		{method: "GET", path: "/v1/topics/%74%31", pattern: "/v1/topics/{topic}", topic: "t1"},
		{method: "GET", path: "/v1/%74opics/t1", pattern: "/v1/topics/{topic}", topic: "t1"},
		{method: "GET", path: "/v1/topics/t%zz", err: ErrBadRequest},
		{method: "DELETE", path: "/v1/cluster/nodes/x%2Fy", pattern: "/v1/cluster/nodes/{id}", id: "x/y"},
		{method: "DELETE", path: "/v1/cluster/nodes/..", pattern: "/v1/cluster/nodes/{id}", id: ".."},
	}
	for _, c := range cases {
		var r route
		err := rt.match([]byte(c.method), c.path, &r)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%s %q: %v, want %v", c.method, c.path, err, c.err)
			}
			if c.allow != r.allow {
				t.Errorf("%s %q: allow %q, want %q", c.method, c.path, r.allow, c.allow)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %q: %v", c.method, c.path, err)
			continue
		}
		if r.def.Pattern != c.pattern || r.def.Method != c.method || r.topic != c.topic || r.group != c.group || r.dlqID != c.id {
			t.Errorf("%s %q: matched %s %s topic %q group %q id %q, want %s topic %q group %q id %q", c.method, c.path,
				r.def.Method, r.def.Pattern, r.topic, r.group, r.dlqID, c.pattern, c.topic, c.group, c.id)
		}
	}
}

func TestRouteValidate(t *testing.T) {
	rt := mustRouter(t)
	for _, p := range []string{"/v1/topics//messages", "/v1/topics/../messages", "/v1/topics/a\x00b/messages",
		"/v1/topics/t/groups//fetch", "/v1/topics/t/groups/./fetch", "/v1/topics/t/groups/g\xfe/ack"} {
		var r route
		if err := rt.match([]byte("POST"), p, &r); err != nil {
			t.Errorf("%q: %v", p, err)
			continue
		}
		if err := r.validate(); !errors.Is(err, mlog.ErrInvalidName) {
			t.Errorf("%q: validate %v, want ErrInvalidName", p, err)
		}
	}
	var r route
	if err := rt.match([]byte("POST"), "/v1/topics/t/groups/g/fetch", &r); err != nil || r.validate() != nil {
		t.Errorf("valid fetch path: %v %v", err, r.validate())
	}
}

// TestRouteTable checks every route's declaration: a permission (SPEC §8),
// leader routes for everything that reads or changes topics, and the
// permissions SPEC §8 names for the routes it names.
func TestRouteTable(t *testing.T) {
	table := (&Server{core: &core{}}).routes()
	if _, err := newRouter(table); err != nil {
		t.Fatal(err)
	}
	want := map[string]Perm{
		"GET /healthz":                                      PermOpen,
		"GET /readyz":                                       PermOpen,
		"GET /metrics":                                      PermMonitor,
		"GET /v1/cluster":                                   PermMonitor,
		"POST /v1/internal/join":                            PermCluster,
		"GET /v1/internal/status":                           PermCluster,
		"GET /v1/internal/groups/{id}/backup":               PermCluster,
		"PUT /v1/topics/{topic}":                            PermAdmin,
		"DELETE /v1/topics/{topic}":                         PermAdmin,
		"GET /v1/topics/{topic}":                            PermPublish | PermConsume | PermAdmin,
		"GET /v1/topics":                                    PermPublish | PermConsume | PermAdmin,
		"POST /v1/topics/{topic}/messages":                  PermPublish,
		"PUT /v1/topics/{topic}/groups/{group}":             PermConsume | PermAdmin,
		"DELETE /v1/topics/{topic}/groups/{group}":          PermAdmin,
		"POST /v1/topics/{topic}/groups/{group}/fetch":      PermConsume,
		"POST /v1/topics/{topic}/groups/{group}/ack":        PermConsume,
		"POST /v1/topics/{topic}/groups/{group}/nack":       PermConsume,
		"POST /v1/topics/{topic}/groups/{group}/extend":     PermConsume,
		"POST /v1/topics/{topic}/groups/{group}/dlq/replay": PermAdmin,
		"DELETE /v1/topics/{topic}/groups/{group}/dlq/{id}": PermAdmin,
		"POST /v1/topics/{topic}/messages:batch":            PermPublish,
		"GET /v1/topics/{topic}/groups/{group}/dlq":         PermConsume, // SPEC §8: listing dead letters is consume's
	}
	for _, r := range table {
		k := r.Method + " " + r.Pattern
		if p, ok := want[k]; ok && p != r.Perm {
			t.Errorf("%s needs %s, want %s", k, r.Perm, p)
		}
		if r.hasTopic && !r.Leader {
			t.Errorf("%s names a topic but does not run on the leader", k)
		}
		delete(want, k)
	}
	for k := range want {
		t.Errorf("%s: not in the route table", k)
	}
}

func BenchmarkRouterMatchPublish(b *testing.B) {
	rt := mustRouter(b)
	method := []byte("POST")
	b.ReportAllocs()
	for b.Loop() {
		var r route
		if err := rt.match(method, "/v1/topics/orders/messages", &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRouterMatchDLQ(b *testing.B) {
	rt := mustRouter(b)
	method := []byte("DELETE")
	b.ReportAllocs()
	for b.Loop() {
		var r route
		if err := rt.match(method, "/v1/topics/orders/groups/billing/dlq/12345", &r); err != nil {
			b.Fatal(err)
		}
	}
}
