package api

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.yaml.in/yaml/v3"
)

// routeStatuses are the statuses each route answers besides those every
// route of its kind answers (see expectedStatuses). Keep it in step with
// the handlers: it is the reviewer's check on openapi.yaml.
var routeStatuses = map[string][]int{
	"GET /healthz":                        {200},
	"GET /readyz":                         {200, 503},
	"GET /metrics":                        {200},
	"GET /v1/cluster":                     {200},
	"GET /v1/internal/status":             {200},
	"POST /v1/internal/join":              {200, 409}, // state_format_unsupported
	"POST /v1/internal/forward":           {200, 400}, // bad_request: a body it cannot read
	"DELETE /v1/cluster/nodes/{id}":       {200, 404, 409},
	"POST /v1/cluster/nodes/{id}/drain":   {200, 404, 409}, // node_not_found; no_move_target
	"POST /v1/cluster/rebalance":          {200},
	"GET /v1/cluster/backup":              {200, 503, 507},      // unavailable: a data group no member copies; insufficient_storage: no room for the copy
	"GET /v1/internal/groups/{id}/backup": {200, 400, 404, 507}, // bad_request: not a data group id; not_found: no replica here
	"POST /v1/cluster/clock/accept":       {200, 400},           // bad_request: a body that is not an empty object
	"GET /v1/openapi.yaml":                {200},
	"GET /debug/pprof/{profile}":          {200, 404}, // not_found: profiles are off (no --pprof)
	"POST /debug/pprof/{profile}":         {200, 404},
	"GET /ui":                             {200},
	"GET /ui/{file}":                      {200, 404}, // not_found: no such file

	"GET /v1/topics":                         {200},
	"PUT /v1/topics/{topic}":                 {200, 201, 409, 507}, // partitions_shrink, insufficient_storage on create
	"GET /v1/topics/{topic}":                 {200, 404},
	"DELETE /v1/topics/{topic}":              {200, 404},
	"POST /v1/topics/{topic}/messages":       {200, 201, 404, 409, 413, 507},
	"POST /v1/topics/{topic}/messages:batch": {200, 404, 409, 413, 507},
	"GET /v1/topics/{topic}/messages":        {200, 404}, // bad_request: a partition the topic lacks

	"PUT /v1/topics/{topic}/groups/{group}":             {200, 201, 404},
	"DELETE /v1/topics/{topic}/groups/{group}":          {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/fetch":      {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/ack":        {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/nack":       {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/extend":     {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/process":    {200, 404, 409, 413, 507}, // stale_receipt
	"GET /v1/topics/{topic}/keys/{key}":                 {200, 404},
	"POST /v1/topics/{topic}/reconcile":                 {200, 404, 413},
	"GET /v1/topics/{topic}/groups/{group}/dlq":         {200, 404},
	"POST /v1/topics/{topic}/groups/{group}/dlq/replay": {200, 404, 507},
	"DELETE /v1/topics/{topic}/groups/{group}/dlq/{id}": {200, 400, 404}, // bad_request: id not a positive integer
}

// genericStatuses are answered before or instead of routing (a request
// that is not HTTP, a path or method no route has): openapi.yaml says so
// once, in info.description, rather than on every operation.
var genericStatuses = []int{400, 404, 405, 408, 413, 429, 431, 500}

// expectedStatuses derives what a route answers from its declaration:
// a route that is not open answers 401 without a known token and 403
// without its permission (but GET /v1/topics, a topic permission on no
// topic in particular, only filters what it shows: see authorize); a
// leader route reads Mq-Timeout-Ms (400 bad_header) and may find no
// quorum or leader (503); a route naming a topic or group refuses a bad
// name (400 invalid_name).
func expectedStatuses(r *Route, key string) []int {
	st := slices.Clone(routeStatuses[key])
	if !r.Perm.Has(PermOpen) {
		st = append(st, 401)
		if r.hasTopic || r.Perm&^PermAnyTopic != 0 {
			st = append(st, 403)
		}
	}
	if r.Leader {
		st = append(st, 400, 503)
	}
	if r.hasTopic || r.hasGroup {
		st = append(st, 400)
	}
	slices.Sort(st)
	return slices.Compact(st)
}

// docPath is a route pattern as OpenAPI writes it: {name...} is {name}.
func docPath(pattern string) string { return strings.ReplaceAll(pattern, "...}", "}") }

type openapiOp struct {
	Parameters []struct {
		Name string `yaml:"name"`
		In   string `yaml:"in"`
	} `yaml:"parameters"`
	Responses  map[string]yaml.Node `yaml:"responses"`
	Permission string               `yaml:"x-mqd-permission"`
	Leader     *bool                `yaml:"x-mqd-leader"`
}

type openapiDocument struct {
	OpenAPI string `yaml:"openapi"`
	Info    struct {
		Description string `yaml:"description"`
	} `yaml:"info"`
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Responses map[string]yaml.Node `yaml:"responses"`
		Schemas   struct {
			Error struct {
				Properties struct {
					Error struct {
						Properties struct {
							Code struct {
								Enum []string `yaml:"enum"`
							} `yaml:"code"`
						} `yaml:"properties"`
					} `yaml:"error"`
				} `yaml:"properties"`
			} `yaml:"Error"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

func parseOpenAPI(t *testing.T, b []byte) (*openapiDocument, map[string]openapiOp) {
	t.Helper()
	var d openapiDocument
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if d.OpenAPI != "3.1.0" {
		t.Errorf("openapi: %q, want 3.1.0", d.OpenAPI)
	}
	ops := map[string]openapiOp{}
	for p, item := range d.Paths {
		for k, n := range item {
			if !slices.Contains(httpMethods, k) {
				continue // parameters, summary, ...
			}
			var op openapiOp
			if err := n.Decode(&op); err != nil {
				t.Fatalf("%s %s: %v", k, p, err)
			}
			ops[strings.ToUpper(k)+" "+p] = op
		}
	}
	return &d, ops
}

// TestOpenAPI walks the route table and openapi.yaml: every route is
// documented with its permission, leader flag and exactly the statuses
// it can answer, and the document has nothing the table lacks.
func TestOpenAPI(t *testing.T) {
	d, ops := parseOpenAPI(t, openapiDoc)
	table := (&Server{core: &core{}}).routes()
	if _, err := newRouter(table); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range table {
		r := &table[i]
		key := r.Method + " " + docPath(r.Pattern)
		seen[key] = true
		op, ok := ops[key]
		if !ok {
			t.Errorf("%s: in the route table, not in openapi.yaml", key)
			continue
		}
		if _, ok := routeStatuses[key]; !ok {
			t.Errorf("%s: no entry in routeStatuses (say what it answers)", key)
		}
		if op.Permission != r.Perm.String() {
			t.Errorf("%s: x-mqd-permission %q, the route needs %q", key, op.Permission, r.Perm)
		}
		if op.Leader == nil || *op.Leader != r.Leader {
			t.Errorf("%s: x-mqd-leader %v, the route's Leader is %v", key, op.Leader, r.Leader)
		}
		var documented []int
		for code := range op.Responses {
			n, err := strconv.Atoi(code)
			if err != nil {
				t.Errorf("%s: response %q is not a status code", key, code)
				continue
			}
			documented = append(documented, n)
		}
		slices.Sort(documented)
		if want := expectedStatuses(r, key); !slices.Equal(documented, want) {
			t.Errorf("%s: openapi.yaml documents statuses %v, the route answers %v", key, documented, want)
		}
		checkErrorResponses(t, d, key, op)
		var query []string
		for _, p := range op.Parameters {
			if p.In == "query" {
				query = append(query, p.Name)
			}
		}
		if strings.HasPrefix(r.Pattern, "/v1/") && !slices.Equal(query, r.Query) {
			t.Errorf("%s: openapi.yaml documents query parameters %v, the route takes %v (any other is a 400)", key, query, r.Query)
		}
	}
	for key := range ops {
		if !seen[key] {
			t.Errorf("%s: in openapi.yaml, not in the route table", key)
		}
	}
	for key := range routeStatuses {
		if !seen[key] {
			t.Errorf("%s: in routeStatuses, not in the route table", key)
		}
	}
	checkCatalogue(t, d, ops)
}

// A node without --pprof answers the profile routes 404, so routeStatuses
// (and through TestOpenAPI, openapi.yaml) must list it.
func TestPprofOffIsDocumented(t *testing.T) {
	n := 0
	for _, r := range (&Server{core: &core{}}).routes() {
		key := r.Method + " " + docPath(r.Pattern)
		if !strings.HasPrefix(key, "GET /debug/pprof/") && !strings.HasPrefix(key, "POST /debug/pprof/") {
			continue
		}
		n++
		var ctx fasthttp.RequestCtx
		err := r.handler(&ctx, &route{})
		if got := classify(err); err == nil || got.status != 404 {
			t.Errorf("%s without --pprof: %v (%+v), want a 404", key, err, got)
		}
		if !slices.Contains(routeStatuses[key], 404) {
			t.Errorf("%s answers 404 without --pprof; routeStatuses does not list it", key)
		}
	}
	if n != 2 {
		t.Errorf("%d profile routes, want GET and POST", n)
	}
}

// checkErrorResponses: every 4xx/5xx answer of op is the Error schema.
func checkErrorResponses(t *testing.T, d *openapiDocument, key string, op openapiOp) {
	t.Helper()
	for code, n := range op.Responses {
		if code[0] != '4' && code[0] != '5' || key+" "+code == "GET /readyz 503" { // not ready: not an error
			continue
		}
		var resp struct {
			Ref     string `yaml:"$ref"`
			Content map[string]struct {
				Schema struct {
					Ref string `yaml:"$ref"`
				} `yaml:"schema"`
			} `yaml:"content"`
		}
		if err := n.Decode(&resp); err != nil {
			t.Fatalf("%s %s: %v", key, code, err)
		}
		if name, ok := strings.CutPrefix(resp.Ref, "#/components/responses/"); ok {
			ref, ok := d.Components.Responses[name]
			if !ok {
				t.Errorf("%s %s: $ref %s does not exist", key, code, resp.Ref)
				continue
			}
			if err := ref.Decode(&resp); err != nil {
				t.Fatalf("%s %s: %v", key, code, err)
			}
		}
		if len(resp.Content) != 1 || resp.Content["application/json"].Schema.Ref != "#/components/schemas/Error" {
			t.Errorf("%s %s: an error answer must be application/json with the Error schema", key, code)
		}
	}
}

// checkCatalogue: the Error schema's codes are exactly the catalogue's
// (and internal), and every status the catalogue can answer is on some
// operation or among the generic ones that info.description explains.
func checkCatalogue(t *testing.T, d *openapiDocument, ops map[string]openapiOp) {
	t.Helper()
	codes := map[string]bool{"internal": true}
	statuses := map[int]bool{500: true}
	for _, c := range catalogue {
		codes[c.code] = true
		statuses[c.status] = true
	}
	enum := d.Components.Schemas.Error.Properties.Error.Properties.Code.Enum
	for _, c := range enum {
		if !codes[c] {
			t.Errorf("Error.code enum has %q, the catalogue (api/errors.go) does not", c)
		}
	}
	for c := range codes {
		if !slices.Contains(enum, c) {
			t.Errorf("catalogue code %q is missing from openapi.yaml's Error.code enum", c)
		}
	}
	onOps := map[int]bool{}
	for _, op := range ops {
		for code := range op.Responses {
			n, _ := strconv.Atoi(code)
			onOps[n] = true
		}
	}
	for _, st := range slices.Sorted(maps.Keys(statuses)) {
		if onOps[st] {
			continue
		}
		if !slices.Contains(genericStatuses, st) {
			t.Errorf("catalogue status %d: no operation in openapi.yaml answers it", st)
		} else if !strings.Contains(d.Info.Description, fmt.Sprintf("`%d ", st)) {
			t.Errorf("generic status %d is not explained in openapi.yaml's info.description", st)
		}
	}
}

// The document is served as it is embedded, as YAML.
func TestOpenAPIServed(t *testing.T) {
	rt := mustRouter(t)
	var r route
	if err := rt.match([]byte("GET"), "/v1/openapi.yaml", &r); err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	if err := r.def.handler(&ctx, &r); err != nil {
		t.Fatal(err)
	}
	if ct := string(ctx.Response.Header.ContentType()); ct != "application/yaml" || ctx.Response.StatusCode() != 200 {
		t.Errorf("GET /v1/openapi.yaml: %d %q, want 200 application/yaml", ctx.Response.StatusCode(), ct)
	}
	if string(ctx.Response.Body()) != string(openapiDoc) {
		t.Error("GET /v1/openapi.yaml: the body is not the embedded document")
	}
}
