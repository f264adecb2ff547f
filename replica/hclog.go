package replica

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hashicorp/raft logs through hclog; hclogAdapter sends its lines to the
// node's slog logger (one format for the whole process) and keeps them
// quiet:
//   - raft's info lines (state changes, elections won) become debug: the
//     node logs the few that matter itself ("became leader", ...);
//   - the lines raft repeats for every failed attempt to reach a peer
//     become debug: the node says once that a peer is unreachable and once
//     that it is back (Node.watch, from raft's heartbeat observations);
//   - any line raft logs at info or above, repeated, is logged once per
//     repeatWindow, with how many were suppressed in between.

// repeatWindow is how long a repeated raft warning stays quiet.
const repeatWindow = 30 * time.Second

// quieter sets the level of raft lines that are routine: per-attempt
// failures to reach a peer (debug: Node.watch reports the peer once), and
// what every start, election or catch-up logs (info).
var quieter = map[string]slog.Level{
	"failed to heartbeat to":                                    slog.LevelDebug,
	"failed to appendEntries to":                                slog.LevelDebug,
	"failed to pipeline appendEntries":                          slog.LevelDebug,
	"failed to start pipeline replication to":                   slog.LevelDebug,
	"failed to send snapshot to":                                slog.LevelDebug,
	"failed to contact":                                         slog.LevelDebug, // one per peer per lease check
	"failed to make requestVote RPC":                            slog.LevelDebug,
	"target does not support pre-vote RPC, treating as granted": slog.LevelDebug,
	"appendEntries rejected, sending older logs":                slog.LevelDebug,
	"failed to get previous log":                                slog.LevelDebug, // a follower behind the leader: raft backs up
	"previous log term mis-match":                               slog.LevelInfo,  // log repair after a leader change

	"heartbeat timeout reached, starting election":                      slog.LevelInfo,
	"Election timeout reached, restarting election":                     slog.LevelInfo,
	"no known peers, aborting election":                                 slog.LevelInfo,
	"not part of stable configuration, aborting election":               slog.LevelInfo,
	"pre-vote is disabled because it is not supported by the Transport": slog.LevelInfo,
	"rejecting vote request since we have a leader":                     slog.LevelInfo,
	"rejecting pre-vote request since we have a leader":                 slog.LevelInfo,
	"new leader elected, stepping down":                                 slog.LevelInfo,
	"peer has newer term, stopping replication":                         slog.LevelInfo, // a leader superseded, as at every hand-off
}

// benign lists raft errors that are routine when an argument holds the
// given text: the node recovers by itself, and an operator has nothing to
// do.
var benign = []struct {
	msg, arg string
	level    slog.Level
}{
	// A follower behind the log's start: replication sends a snapshot
	// instead (as after a restore or a snapshot's compaction).
	{"failed to get log", "log not found", slog.LevelDebug},
	// The connections of a node that is stopping.
	{"failed to decode incoming command", "transport shutdown", slog.LevelDebug},
	{"failed to decode incoming command", "use of closed network connection", slog.LevelDebug},
}

type hclogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
	rep     *repeats
}

// repeats remembers when each raft warning was last logged.
type repeats struct {
	mu   sync.Mutex
	seen map[string]*repeat
	now  func() time.Time
}

type repeat struct {
	at         time.Time
	suppressed int
}

// NewHclog returns an hclog.Logger writing to l.
func NewHclog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{l: l, name: name, rep: &repeats{seen: map[string]*repeat{}, now: time.Now}}
}

// allow reports whether msg may be logged now, and how many repeats of it
// were suppressed since it last was.
func (r *repeats) allow(msg string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	p := r.seen[msg]
	if p != nil && now.Sub(p.at) < repeatWindow {
		p.suppressed++
		return false, 0
	}
	if len(r.seen) > 1000 {
		clear(r.seen)
	}
	n := 0
	if p != nil {
		n = p.suppressed
	}
	r.seen[msg] = &repeat{at: now}
	return true, n
}

// level maps raft's level for msg (with args) to the one mqd logs it at.
func (a *hclogAdapter) level(level hclog.Level, msg string, args []any) slog.Level {
	if lv, ok := quieter[msg]; ok && level >= hclog.Warn {
		return lv
	}
	if level >= hclog.Warn {
		for _, b := range benign {
			if b.msg != msg {
				continue
			}
			for _, v := range args {
				if strings.Contains(fmt.Sprint(v), b.arg) {
					return b.level
				}
			}
		}
	}
	switch {
	case level <= hclog.Debug:
		return slog.LevelDebug - 4 // raft's debug and trace are below ours
	case level == hclog.Info:
		return slog.LevelDebug
	case level == hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || level == hclog.NoLevel {
		return
	}
	lv := a.level(level, msg, args)
	ctx := context.Background()
	if !a.l.Enabled(ctx, lv) {
		return
	}
	attrs := make([]any, 0, len(a.implied)+len(args)+4)
	attrs = append(attrs, "component", a.name)
	attrs = append(attrs, a.implied...)
	attrs = append(attrs, args...)
	if lv >= slog.LevelInfo {
		ok, n := a.rep.allow(msg)
		if !ok {
			return
		}
		if n > 0 {
			attrs = append(attrs, "repeated", n)
		}
	}
	a.l.Log(ctx, lv, msg, fixArgs(attrs)...)
}

// fixArgs makes hclog's key/value list valid for slog: an odd final value
// gets a key, and errors become their text.
func fixArgs(args []any) []any {
	if len(args)%2 == 1 {
		args = append(args[:len(args)-1], "extra", args[len(args)-1])
	}
	for i := 1; i < len(args); i += 2 {
		switch v := args[i].(type) {
		case error:
			args[i] = v.Error()
		case hclog.Format:
			args[i] = fmt.Sprintf(v[0].(string), v[1:]...)
		}
	}
	return args
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l slog.Level) bool { return a.l.Enabled(context.Background(), l) }
func (a *hclogAdapter) IsTrace() bool             { return a.enabled(slog.LevelDebug - 4) }
func (a *hclogAdapter) IsDebug() bool             { return a.enabled(slog.LevelDebug - 4) }
func (a *hclogAdapter) IsInfo() bool              { return a.enabled(slog.LevelDebug) }
func (a *hclogAdapter) IsWarn() bool              { return true }
func (a *hclogAdapter) IsError() bool             { return true }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.implied = append(append([]any(nil), a.implied...), args...)
	return &c
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}

// SetLevel is a no-op: the slog handler's level decides.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

func (a *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case a.IsTrace():
		return hclog.Trace
	case a.IsInfo():
		return hclog.Info
	}
	return hclog.Warn
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		a.Warn(strings.TrimSpace(string(p)))
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
