package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// fakeAPI is a server that answers every request with status and body and
// records the request bodies it got, by "METHOD path".
type fakeAPI struct {
	url    string
	bodies map[string][]string
}

func mustFakeAPI(t *testing.T, status int, body string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{bodies: map[string][]string{}}
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		f.bodies[r.Method+" "+r.URL.Path] = append(f.bodies[r.Method+" "+r.URL.Path], string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// runWith runs `mqd args... --server url` in process.
func runWith(url string, args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	c := &cli{stdin: strings.NewReader(""), stdout: &out, stderr: &errb}
	code = c.run(context.Background(), append(args, "--server", url))
	return code, out.String(), errb.String()
}

// An explicit --partitions is sent even when it is 0, so that the server
// refuses it (it used to be dropped: a topic with 1 partition, exit 0).
func TestTopicCreatePartitionsSent(t *testing.T) {
	const topic = `{"name":"p","config":{},"partitions":[{"partition":0}]}`
	for _, c := range []struct {
		args []string
		want string // the PUT's body
	}{
		{[]string{"--partitions", "0"}, `{"partitions":0}`},
		{[]string{"--partitions=-2"}, `{"partitions":-2}`},
		{[]string{"--partitions", "3"}, `{"partitions":3}`},
		{[]string{"--partitions", "0", "--config", `{"partitions":5}`}, `{"partitions":0}`},
		{[]string{"--config", `{"partitions":5}`}, `{"partitions":5}`},
		{nil, `{}`},
	} {
		f := mustFakeAPI(t, 201, topic)
		if code, _, errOut := runWith(f.url, append([]string{"topic", "create", "p"}, c.args...)...); code != 0 {
			t.Errorf("%q: exit %d: %s", c.args, code, errOut)
		}
		if got := f.bodies["PUT /v1/topics/p"]; len(got) != 1 || got[0] != c.want {
			t.Errorf("%q: sent %q, want %q", c.args, got, c.want)
		}
	}
	f := mustFakeAPI(t, 400, `{"error":{"code":"invalid_config","message":"partitions must be 1..1024, got 0"}}`)
	if code, _, errOut := runWith(f.url, "topic", "create", "p", "--partitions", "0"); code != 1 || !strings.Contains(errOut, "invalid_config") {
		t.Errorf("--partitions 0 refused by the server: exit %d, %q; want 1 with invalid_config", code, errOut)
	}
}

// dlq replay --json prints the API's answer as it is (it used to print
// only "accepted", leaving out rate_per_sec).
func TestDLQReplayJSONIsTheAnswer(t *testing.T) {
	const answer = `{"accepted":2,"rate_per_sec":10}`
	f := mustFakeAPI(t, 200, answer+"\n")
	code, out, errOut := runWith(f.url, "dlq", "replay", "dl", "g", "--all", "--rate", "10", "--json")
	if code != 0 || out != answer+"\n" {
		t.Errorf("dlq replay --json: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, answer+"\n")
	}
	code, out, errOut = runWith(f.url, "dlq", "replay", "dl", "g", "--id", "1,2")
	if code != 0 || out != "replaying 2 dead letter(s) at 10 per second\n" {
		t.Errorf("dlq replay: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := f.bodies["POST /v1/topics/dl/groups/g/dlq/replay"]; len(got) != 2 ||
		got[0] != `{"all":true,"rate_per_sec":10}` || got[1] != `{"ids":[1,2]}` {
		t.Errorf("replay requests: %q", got)
	}
	// A --rate given is checked, 0 included (it used to mean the default).
	for _, r := range []string{"0", "-1", "100001"} {
		if code, _, errOut := runWith(f.url, "dlq", "replay", "dl", "g", "--all", "--rate", r); code != 2 || !strings.Contains(errOut, "--rate must be in 1..100000") {
			t.Errorf("dlq replay --rate %s: exit %d, stderr %q; want a usage error", r, code, errOut)
		}
	}
	if n := len(f.bodies["POST /v1/topics/dl/groups/g/dlq/replay"]); n != 2 {
		t.Errorf("refused --rate values reached the API: %d requests", n)
	}
}
