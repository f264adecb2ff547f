package api

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// The resolved route series count and time every answer, under the route
// pattern and the status code, as the vectors' own lookups did.
func TestRouteSeriesCount(t *testing.T) {
	s := newBenchServer(t, Options{})
	do := func(method, path string) {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(method)
		ctx.Request.SetRequestURI(path)
		ctx.Request.SetBody([]byte("x"))
		s.handle(&ctx)
	}
	for range 3 {
		do("POST", "/v1/topics/orders/messages")
	}
	do("POST", "/v1/topics/missing/messages")
	do("GET", "/nowhere")
	const pub = "/v1/topics/{topic}/messages"
	counts := map[[2]string]float64{}
	var timed uint64
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetName() {
			case "mqd_http_requests_total":
				counts[[2]string{l["route"], l["code"]}] = m.GetCounter().GetValue()
			case "mqd_http_request_seconds":
				if l["route"] == pub {
					timed = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	want := map[[2]string]float64{{pub, "201"}: 3, {pub, "404"}: 1, {"unmatched", "404"}: 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("mqd_http_requests_total{route=%q,code=%q} = %v, want %v (all: %v)", k[0], k[1], counts[k], v, counts)
		}
	}
	if timed != 4 {
		t.Errorf("mqd_http_request_seconds_count{route=%q} = %d, want 4", pub, timed)
	}
}
