package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqd/mqd/raftfsm"
	"github.com/valyala/fasthttp"
)

// ?stale= takes ok or nothing; on a route that is not a stale-able read
// it is never looked at (checkQuery refuses it before).
func TestStaleAsked(t *testing.T) {
	read := &route{def: &Route{Stale: true}}
	other := &route{def: &Route{}}
	for _, c := range []struct {
		query string
		r     *route
		want  bool
		bad   bool
	}{
		{"", read, false, false}, {"stale=ok", read, true, false}, {"stale=", read, false, true},
		{"stale=yes", read, false, true}, {"stale=OK", read, false, true}, {"stale=ok", other, false, false},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/v1/topics?" + c.query)
		got, err := staleAsked(&ctx, c.r)
		if got != c.want || (err != nil) != c.bad || (err != nil && !errors.Is(err, ErrBadRequest)) {
			t.Errorf("?%s (stale route %v): %v, %v; want %v, bad %v", c.query, c.r.def.Stale, got, err, c.want, c.bad)
		}
	}
}

// The resource alarms fire at their thresholds and not below them.
func TestAlarms(t *testing.T) {
	ok := raftfsm.Resources{DiskFreeBytes: 30, DiskMinFreeBytes: 10, OpenFiles: 80, OpenFilesLimit: 100,
		ClockOffsetMs: 250, MaxClockOffsetMs: 500}
	if a := alarms(ok); len(a) != 0 {
		t.Errorf("all within bounds: %v", a)
	}
	for _, c := range []struct {
		name string
		mod  func(*raftfsm.Resources)
		want string
	}{
		{"disk low", func(r *raftfsm.Resources) { r.DiskFreeBytes, r.DiskLow = 9, true }, "under --min-free-disk"},
		{"disk near", func(r *raftfsm.Resources) { r.DiskFreeBytes = 19 }, "less than twice"},
		{"open files", func(r *raftfsm.Resources) { r.OpenFiles = 81 }, "open files: 81 of the limit 100"},
		{"clock bad", func(r *raftfsm.Resources) { r.ClockBad, r.ClockReason = true, "off by 9s" }, "clock: off by 9s"},
		{"clock near", func(r *raftfsm.Resources) { r.ClockOffsetMs = -251 }, "over half of --max-clock-offset"},
	} {
		r := ok
		c.mod(&r)
		a := alarms(r)
		if len(a) != 1 || !strings.Contains(a[0], c.want) {
			t.Errorf("%s: %v, want one alarm with %q", c.name, a, c.want)
		}
	}
	if a := alarms(raftfsm.Resources{OpenFiles: -1, OpenFilesLimit: 10}); len(a) != 0 {
		t.Errorf("without /proc: %v", a)
	}
}
