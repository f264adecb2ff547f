package ops

import (
	"regexp"
	"strings"
	"testing"

	tc "github.com/mqd/mqd/internal/testcluster"
	"github.com/mqd/mqd/test/systest"
)

// --help writes its text once, to stdout, and exits 0: for mqd, the
// server, every command `mqd --help` lists and every command group.
func TestCLIHelpOnStdout(t *testing.T) {
	t.Parallel()
	main := systest.RunCLI(t, "", "", "--help")
	if main.Code != 0 || main.Stderr != "" || strings.Count(main.Stdout, "--bootstrap-expect") != 1 {
		t.Fatalf("mqd --help: exit %d, stderr %q, --bootstrap-expect %d times in stdout, want 0, \"\", once",
			main.Code, main.Stderr, strings.Count(main.Stdout, "--bootstrap-expect"))
	}
	_, list, _ := strings.Cut(main.Stdout, "\nCommands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	word := regexp.MustCompile(`^[a-z]+$`)
	var names []string
	groups := map[string]bool{}
	for _, line := range strings.Split(list, "\n") {
		usage, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
		var name []string
		for _, w := range strings.Fields(usage) {
			if !word.MatchString(w) {
				break
			}
			name = append(name, w)
		}
		if len(name) == 0 {
			t.Fatalf("mqd --help: no command in %q", line)
		}
		names = append(names, strings.Join(name, " "))
		if len(name) == 2 {
			groups[name[0]] = true
		}
	}
	if len(names) < 12 || len(groups) < 4 {
		t.Fatalf("mqd --help lists %q (groups %v): fewer than expected", names, groups)
	}
	check := func(args []string, want string) {
		t.Helper()
		r := systest.RunCLI(t, "", "", args...)
		if r.Code != 0 || r.Stderr != "" || !strings.Contains(r.Stdout, want) || strings.Count(strings.ToLower(r.Stdout), "usage:") > 1 {
			t.Errorf("mqd %s: exit %d, stderr %q, stdout %q; want exit 0, nothing on stderr, %q once on stdout",
				strings.Join(args, " "), r.Code, r.Stderr, r.Stdout, want)
		}
	}
	check([]string{"serve", "--help"}, "--raft-advertise-addr")
	check([]string{"-h"}, "Commands:")
	for _, name := range names {
		check(append(strings.Fields(name), "--help"), "Usage: mqd "+name)
	}
	for g := range groups {
		check([]string{g, "--help"}, g+" ")
	}
	// A mistake still goes to stderr with exit 2.
	if r := systest.RunCLI(t, "", "", "topic", "list", "--nope"); r.Code != 2 || r.Stdout != "" || !strings.Contains(r.Stderr, "usage: mqd topic list") {
		t.Errorf("mqd topic list --nope: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
}

// What the client commands say: a topic's partitions in the singular or
// plural, bench's header in words, and sub's account of what it did.
func TestCLISaysWhatItDid(t *testing.T) {
	t.Parallel()
	c := tc.Start(t, 1)
	srv := c.Node(0).URL()
	mustLine := func(what, got, want string) {
		t.Helper()
		if !strings.Contains(got, want) {
			t.Errorf("%s: %q lacks %q", what, got, want)
		}
	}
	mustLine("create", systest.OK(t, srv, "", "topic", "create", "jobs"), "created topic jobs (1 partition)\n")
	mustLine("create 2", systest.OK(t, srv, "", "topic", "create", "two", "--partitions", "2"), "created topic two (2 partitions)\n")
	mustLine("update", systest.OK(t, srv, "", "topic", "create", "jobs", "--config", `{"max_retry":0}`), "updated topic jobs (1 partition)\n")

	systest.OK(t, srv, "a\nb\nc\nd\n", "pub", "two")
	r := systest.RunCLI(t, srv, "", "sub", "two", "--group", "g", "--count", "2")
	if r.Code != 0 || !strings.Contains(r.Stderr, "mqd sub: received 2, acked 2\n") {
		t.Errorf("sub --count 2: exit %d, stderr %q, want it to say it acked 2", r.Code, r.Stderr)
	}
	r = systest.RunCLI(t, srv, "", "sub", "two", "--group", "g", "--count", "1", "--nack", "later")
	if r.Code != 0 || !strings.Contains(r.Stderr, "mqd sub: received 1, nacked 1\n") {
		t.Errorf("sub --nack: exit %d, stderr %q, want it to say it nacked 1", r.Code, r.Stderr)
	}
	r = systest.RunCLI(t, srv, "", "sub", "two", "--group", "h", "--count", "1", "--no-ack")
	if r.Code != 0 || !strings.Contains(r.Stderr, "mqd sub: received 1, left leased") {
		t.Errorf("sub --no-ack: exit %d, stderr %q, want it to say it left 1 leased", r.Code, r.Stderr)
	}
	r = systest.RunCLI(t, srv, "", "sub", "jobs", "--group", "g", "--wait", "0")
	if r.Code != 0 || r.Stdout != "" || !strings.Contains(r.Stderr, "mqd sub: received 0, acked 0\n") {
		t.Errorf("sub of an empty topic: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}

	out := systest.OK(t, srv, "", "bench", "--duration", "300ms", "--publishers", "1", "--consumers", "1", "--size", "64")
	if !regexp.MustCompile(`topic bench-\w+: 1 publisher, 1 consumer, 64-byte messages, no idempotency keys\n`).MatchString(out) {
		t.Errorf("bench header: %q", out)
	}
	out = systest.OK(t, srv, "", "bench", "--duration", "300ms", "--publishers", "2", "--consumers", "0", "--key")
	if !regexp.MustCompile(`: 2 publishers, 0 consumers, 256-byte messages, a unique idempotency key each\n`).MatchString(out) {
		t.Errorf("bench header: %q", out)
	}
}
