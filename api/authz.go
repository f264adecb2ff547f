package api

import (
	"fmt"
	"strings"

	"github.com/mqd/mqd/auth"
	"github.com/valyala/fasthttp"
)

// authorize decides whether the caller may use route r (its Perm), before
// anything about the request is validated or looked up. The caller is its
// bearer token; on node-to-node routes a TLS client certificate verified
// against the cluster's CA also counts. A request a follower forwards
// carries its caller's token and is authorized as that caller again at the
// leader; the forwarding node's own certificate only ever opens the
// node-to-node routes, which the follower authorized for its caller first.
func (s *Server) authorize(ctx *fasthttp.RequestCtx, r *route) error {
	p := r.def.Perm
	if p.Has(PermOpen) {
		return nil
	}
	if nodeRoute(r.def) && s.opts.TLS != nil && peerCertified(ctx) {
		return nil
	}
	if s.opts.Auth == nil {
		// Open, as everything is without tokens; but with TLS only a
		// node of the cluster may join or probe, so that a process
		// without the cluster's certificates cannot become a member.
		if nodeRoute(r.def) && s.opts.TLS != nil {
			return fmt.Errorf("%w: node-to-node routes need a client certificate signed by the cluster's CA", ErrUnauthenticated)
		}
		return nil
	}
	if err := s.authenticate(ctx, r); err != nil {
		return err
	}
	need := authPerm(p)
	if !r.def.hasTopic && p&^PermAnyTopic == 0 {
		// A topic permission on a route without {topic} (GET /v1/topics):
		// every token passes, the handler shows only what it may see.
		return nil
	}
	if !r.id.Allows(need, r.topic) {
		return fmt.Errorf("%w: token %q lacks %s", ErrForbidden, r.id.Name(), describePerm(p, r))
	}
	return nil
}

// nodeRoute reports whether d is one of the routes nodes call on each
// other (/v1/internal/...), as opposed to the cluster routes operators
// call (node removal, backup).
func nodeRoute(d *Route) bool {
	return d.Perm.Has(PermCluster) && strings.HasPrefix(d.Pattern, "/v1/internal/")
}

// authenticate finds the caller's token (when auth is on) and sets r.id.
func (s *Server) authenticate(ctx *fasthttp.RequestCtx, r *route) error {
	if s.opts.Auth == nil {
		return nil
	}
	secret, ok := auth.BearerToken(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if !ok {
		return fmt.Errorf("%w: send Authorization: Bearer <token>", ErrUnauthenticated)
	}
	id, ok := s.opts.Auth.Authenticate(secret)
	if !ok {
		return fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	r.id = id
	return nil
}

// authPerm translates a route's Perm into the auth package's kinds.
func authPerm(p Perm) auth.Perm {
	var out auth.Perm
	for _, m := range []struct {
		api  Perm
		auth auth.Perm
	}{{PermPublish, auth.Publish}, {PermConsume, auth.Consume}, {PermAdmin, auth.Admin},
		{PermCluster, auth.Cluster}, {PermMonitor, auth.Monitor}} {
		if p.Has(m.api) {
			out |= m.auth
		}
	}
	return out
}

// describePerm names what a route needs, for a 403's message:
// "publish:orders", "consume:orders or admin:orders", "monitor".
func describePerm(p Perm, r *route) string {
	out := ""
	for _, b := range []struct {
		bit  Perm
		name string
	}{{PermPublish, "publish"}, {PermConsume, "consume"}, {PermAdmin, "admin"}, {PermCluster, "cluster"}, {PermMonitor, "monitor"}} {
		if !p.Has(b.bit) {
			continue
		}
		n := b.name
		if b.bit&PermAnyTopic != 0 {
			n += ":" + r.topic
		}
		if out != "" {
			out += " or "
		}
		out += n
	}
	return out
}

// peerCertified reports whether the connection presented a client
// certificate that verified against the CA (a node of the cluster).
func peerCertified(ctx *fasthttp.RequestCtx) bool {
	st := ctx.TLSConnectionState()
	return st != nil && len(st.VerifiedChains) > 0
}

// sees reports whether the caller may see topic (any permission on it).
func (r *route) sees(topic string) bool { return r.id == nil || r.id.Sees(topic) }

// admit charges the request to its connection's rate, unless the
// connection is a node of the cluster (a follower forwarding many
// clients' requests, each charged to its token).
func (s *Server) admit(ctx *fasthttp.RequestCtx) error {
	if s.opts.TLS != nil && peerCertified(ctx) {
		return nil
	}
	return s.limits.connection(ctx.Conn())
}
