package main

import (
	"net"
	"os"
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

// A listener on an unspecified host (0.0.0.0, ::) is advertised under the
// host name, never as an address no peer can dial; a given advertise
// address wins, and one with an unspecified host is refused.
func TestAdvertisedDefaults(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	o, err := parseFlags([]string{"--http-addr", "0.0.0.0:7070", "--raft-addr", "[::]:7071", "--insecure"})
	if err != nil {
		t.Fatal(err)
	}
	if o.httpAdvertise != net.JoinHostPort(host, "7070") || o.raftAdvertise != net.JoinHostPort(host, "7071") {
		t.Errorf("advertised %q, %q; want host name %q with the listen ports", o.httpAdvertise, o.raftAdvertise, host)
	}
	o, err = parseFlags([]string{"--http-addr", ":7070", "--raft-addr", "0.0.0.0:7071", "--insecure",
		"--http-advertise-addr", "n1:7070", "--raft-advertise-addr", "n1:7071"})
	if err != nil || o.httpAdvertise != "n1:7070" || o.raftAdvertise != "n1:7071" {
		t.Errorf("given advertise addresses: %+v, %v", o, err)
	}
	if o, err = parseFlags(nil); err != nil || o.httpAdvertise != "127.0.0.1:7070" || o.raftAdvertise != "127.0.0.1:7071" {
		t.Errorf("defaults: %+v, %v; want the listen addresses", o, err)
	}
	if _, err := parseFlags([]string{"--raft-advertise-addr", "0.0.0.0:7071"}); err == nil || !strings.Contains(err.Error(), "other nodes can dial") {
		t.Errorf("--raft-advertise-addr 0.0.0.0:7071: %v, want refused", err)
	}
}
