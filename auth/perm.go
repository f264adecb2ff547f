package auth

import (
	"errors"
	"fmt"
	"strings"
)

// Perm is a set of permission kinds. A route needs any one of the kinds in
// its set; the topic kinds apply to the topics their glob matches.
type Perm uint8

// Permission kinds.
const (
	Publish Perm = 1 << iota // publish:<glob>: publish to matching topics
	Consume                  // consume:<glob>: fetch, ack, nack, extend, create a group, list the DLQ
	Admin                    // admin:<glob>: create, update, delete topics and groups; DLQ replay and delete
	Cluster                  // cluster: join and remove nodes, node-to-node routes
	Monitor                  // monitor: /metrics, /v1/cluster

	// TopicAny is any permission on a topic (GET of a topic).
	TopicAny = Publish | Consume | Admin
)

// Route requirements that are not a permission kind.
const (
	// Authenticated: any known token (GET /v1/topics, which then lists
	// only what the token may see; unknown routes).
	Authenticated Perm = 0
	// Open: no token needed (/healthz, /readyz).
	Open Perm = 1 << 7
)

// ErrInvalid is a token file or permission that cannot be used.
var ErrInvalid = errors.New("invalid auth file")

var kindNames = map[string]Perm{"publish": Publish, "consume": Consume, "admin": Admin, "cluster": Cluster, "monitor": Monitor}

// Permission is one granted right: a kind and, for the topic kinds, the
// glob of the topics it covers.
type Permission struct {
	Kind Perm
	Glob string // only for Publish, Consume, Admin
}

// ParsePermission parses "publish:<glob>", "consume:<glob>",
// "admin:<glob>", "cluster" or "monitor".
func ParsePermission(s string) (Permission, error) {
	name, glob, hasGlob := strings.Cut(s, ":")
	k, ok := kindNames[name]
	if !ok {
		return Permission{}, fmt.Errorf("%w: permission %q: want publish:<glob>, consume:<glob>, admin:<glob>, cluster or monitor", ErrInvalid, s)
	}
	topical := k&TopicAny != 0
	switch {
	case topical && (!hasGlob || glob == ""):
		return Permission{}, fmt.Errorf("%w: permission %q needs a topic glob, as %s:orders* or %s:*", ErrInvalid, s, name, name)
	case topical && !validGlob(glob):
		return Permission{}, fmt.Errorf("%w: permission %q: a glob is a topic name ([A-Za-z0-9._-]) in which * matches any run of characters", ErrInvalid, s)
	case !topical && hasGlob:
		return Permission{}, fmt.Errorf("%w: permission %q takes no topic glob", ErrInvalid, s)
	}
	return Permission{Kind: k, Glob: glob}, nil
}

func (p Permission) String() string {
	for n, k := range kindNames {
		if k == p.Kind {
			if p.Glob != "" {
				return n + ":" + p.Glob
			}
			return n
		}
	}
	return "?"
}

func validGlob(g string) bool {
	if len(g) > 400 {
		return false
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		ok := c == '*' || c == '.' || c == '_' || c == '-' ||
			('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// Match reports whether glob matches name; '*' matches any run of
// characters (also none), every other character itself.
func Match(glob, name string) bool {
	// Iterative matching with one backtrack point (the last '*'): linear
	// in practice, never exponential.
	gi, ni := 0, 0
	star, mark := -1, 0
	for ni < len(name) {
		switch {
		case gi < len(glob) && glob[gi] == '*':
			star, mark = gi, ni
			gi++
		case gi < len(glob) && glob[gi] == name[ni]:
			gi++
			ni++
		case star >= 0:
			gi = star + 1
			mark++
			ni = mark
		default:
			return false
		}
	}
	for gi < len(glob) && glob[gi] == '*' {
		gi++
	}
	return gi == len(glob)
}
