package main

import (
	"strings"
	"testing"
	"time"

	"github.com/mqd/mqd/raftfsm"
)

// Server flags refuse values they cannot honour (serve exits 2) instead
// of replacing them with a default.
func TestParseFlagsRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // in the error; "" when accepted
	}{
		{[]string{"--max-clock-offset", "0"}, "--max-clock-offset must be positive"},
		{[]string{"--max-clock-offset=-1s"}, "--max-clock-offset must be positive"},
		{[]string{"--min-free-disk", "-1"}, "min-free-disk"},
		{[]string{"--rate-per-connection", "-5"}, "must not be negative"},
		{[]string{"--max-clock-offset", "2s"}, ""},
	} {
		_, err := parseFlags(c.args)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: err %v, want one saying %q", c.args, err, c.want)
		}
	}
	t.Setenv("MQD_MAX_CLOCK_OFFSET", "0s")
	if _, err := parseFlags(nil); err == nil {
		t.Error("MQD_MAX_CLOCK_OFFSET=0s accepted")
	}
	if o, err := parseFlags([]string{"--max-clock-offset", "1500ms"}); err != nil || o.maxClockOffset != 1500*time.Millisecond {
		t.Errorf("the flag over the environment: %+v, %v", o, err)
	}
}

func TestParseFlagsDefaultClockOffset(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil || o.maxClockOffset != raftfsm.DefaultMaxClockOffset {
		t.Errorf("default --max-clock-offset: %+v, %v", o, err)
	}
}
