package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseInterspersed(t *testing.T) {
	for _, c := range []struct {
		args    []string
		pos     string
		key     string
		wantErr bool
	}{
		{[]string{"orders", "--key", "k", "hello"}, "orders hello", "k", false},
		{[]string{"--key=k", "orders"}, "orders", "k", false},
		{[]string{"orders", "--", "--key", "-5"}, "orders --key -5", "", false},
		{[]string{"orders", "hello", "--key"}, "", "", true},
		{[]string{"orders", "--nope"}, "", "", true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		key := fs.String("key", "", "")
		pos, err := parseInterspersed(fs, c.args)
		if (err != nil) != c.wantErr {
			t.Errorf("%q: err %v", c.args, err)
			continue
		}
		if err == nil && (strings.Join(pos, " ") != c.pos || *key != c.key) {
			t.Errorf("%q: positional %q key %q; want %q, %q", c.args, pos, *key, c.pos, c.key)
		}
	}
}

// Every registered command has a summary, parses --help, and appears in
// the main help; a group name alone lists its commands with exit 2.
func TestCommandTable(t *testing.T) {
	var help bytes.Buffer
	mainUsage(&help)
	for name, cmd := range commands {
		if cmd.summary == "" || (cmd.setup == nil) == (cmd.raw == nil) {
			t.Errorf("%s: no summary, or not exactly one of setup and raw", name)
		}
		if !strings.Contains(help.String(), "  "+name) {
			t.Errorf("mqd --help lacks %q", name)
		}
		var out, errb bytes.Buffer
		c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
		if code := c.run(context.Background(), append(strings.Fields(name), "--help")); code != 0 {
			t.Errorf("mqd %s --help: exit %d: %s", name, code, errb.String())
		}
	}
	var out, errb bytes.Buffer
	c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
	if code := c.run(context.Background(), []string{"dlq"}); code != 2 || !strings.Contains(errb.String(), "dlq replay") {
		t.Errorf("mqd dlq: exit %d, %q", code, errb.String())
	}
}

func TestHoistClientFlags(t *testing.T) {
	for in, want := range map[string]string{
		"--server http://h:1 topic list":         "topic list --server http://h:1",
		"--json --token=t pub orders hi --key k": "pub --json --token=t orders hi --key k",
		"--id n1 --data-dir d":                   "--id n1 --data-dir d",
		"--server h:1":                           "--server h:1",
		"--server h:1 nope":                      "--server h:1 nope",
		"topic list":                             "topic list",
	} {
		if got := strings.Join(hoistClientFlags(strings.Fields(in)), " "); got != want {
			t.Errorf("hoistClientFlags(%q) = %q, want %q", in, got, want)
		}
	}
}
